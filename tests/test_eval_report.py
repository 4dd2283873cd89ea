"""Report writing and run-curve reading without models: hand-built results, every optional part
present or absent, escaping, and metrics.jsonl errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from alignctl.errors import UserError
from alignctl.eval.curves import panel_series, read_metrics, summarize
from alignctl.eval.report import write_report
from alignctl.templating import md_fence
from alignctl.eval.results import EvalResults
from alignctl.tracking import JsonlSink


def _samples(with_reward: bool, with_reference: bool) -> list[dict]:
    out = []
    for i in range(3):
        record = {"index": i, "data_source": "prompts", "prompt": f"question {i} <b>bold?</b>", "ground_truth": None,
                  "policy": [{"text": f"answer {i} </pre><script>x()</script>", "reward": 0.5 * i if with_reward else None,
                              "length": 30, "tokens": 30, "truncated": False, "correct": None}]}
        if with_reference:
            record["reference"] = [{"text": "", "reward": 0.2 if with_reward else None, "length": 0, "tokens": 1,
                                    "truncated": False, "correct": None}]
        out.append(record)
    return out


CONFIG = {"policy": "runs/p", "reference": None, "reward_model": None, "prompts": "x.parquet", "n": 1,
          "do_sample": False, "max_new_tokens": 8, "num_bootstrap": 1000, "seed": 0, "max_samples_in_report": 20,
          "preference_data": None, "run": None}


@pytest.mark.parametrize("with_reward,with_reference", [(False, False), (True, False), (False, True)])
def test_partial_results_render(tmp_path: Path, with_reward: bool, with_reference: bool) -> None:
    results = EvalResults(num_prompts=3, n=1, mean_length=30.0, samples=_samples(with_reward, with_reference),
                          config={**CONFIG, "reference": "runs/r" if with_reference else None})
    if with_reward:
        results.mean_reward, results.reward_std = 0.5, 0.408
        results.reward_quantiles = {"p10": 0.1, "p50": 0.5, "p90": 0.9}
    write_report(results, tmp_path)
    html = (tmp_path / "report.html").read_text()
    assert "<script>x()</script>" not in html and "&lt;script&gt;x()&lt;/script&gt;" in html
    assert "&lt;b&gt;bold?&lt;/b&gt;" in html
    assert "<h2>Win rate</h2>" not in html  # no reference rewards -> no win-rate section
    assert ("Reward distribution" in html or "reward histogram" in html) is with_reward
    assert (tmp_path / "plots" / "reward_histogram.png").exists() is with_reward
    if with_reference:
        assert "(empty response)" in html
    saved = json.loads((tmp_path / "results.json").read_text())
    assert saved["win_rate"] is None and saved["num_prompts"] == 3
    assert "# Evaluation report" in (tmp_path / "report.md").read_text()


def test_md_fence_cannot_be_closed_by_the_text() -> None:
    assert md_fence("plain") == "```text\nplain\n```"
    assert md_fence("a ```` b") == "`````text\na ```` b\n`````"


def test_read_metrics_from_the_tracker_sink(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    sink.log({"critic/score/mean": 0.1, "reward/p10": 0.0, "reward/p90": 0.3, "actor/entropy": 2.0,
              "val-core/gsm8k/acc/mean@1": 0.2, "val-core/arith/acc/mean@4": 0.5, "timing_s/step": 1.0}, step=1)
    sink.log({"critic/score/mean": 0.4, "reward/p10": 0.1, "reward/p90": float("inf"), "actor/entropy": 1.5}, step=2)
    sink.close()
    series = read_metrics(tmp_path)
    assert series["critic/score/mean"] == [(1.0, 0.1), (2.0, 0.4)]
    assert series["reward/p90"] == [(1.0, 0.3)]  # inf is written as a string and dropped
    panels = dict(panel_series(series))
    assert list(panels) == ["Reward (mean, p10 / p50 / p90)", "Entropy", "Validation accuracy"]
    assert list(panels["Validation accuracy"]) == ["val-core/arith/acc/mean@4", "val-core/gsm8k/acc/mean@1"]
    assert "timing_s/step" not in {k for group in panels.values() for k in group}
    summary = summarize(panel_series(series))
    assert summary["actor/entropy"] == {"first": 2.0, "last": 1.5, "min": 1.5, "max": 2.0, "steps": 2.0}


def test_a_multi_turn_run_gets_a_tool_use_panel(tmp_path: Path) -> None:
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    for step, (turns, calls, valid) in enumerate(((1.2, 0.2, 0.5), (2.0, 1.0, 1.0)), 1):
        sink.log({"critic/score/mean": 0.5, "multi_turn/turns_mean": turns, "multi_turn/calls_per_sample": calls,
                  "multi_turn/valid_call_share": valid, "multi_turn/tools_s": 0.01}, step=step)
    sink.close()
    panels = dict(panel_series(read_metrics(tmp_path)))
    assert panels["Tool use (multi-turn)"] == {"multi_turn/turns_mean": [(1.0, 1.2), (2.0, 2.0)],
                                               "multi_turn/calls_per_sample": [(1.0, 0.2), (2.0, 1.0)],
                                               "multi_turn/valid_call_share": [(1.0, 0.5), (2.0, 1.0)]}


def test_a_strict_rule_run_gets_an_answer_format_panel(tmp_path: Path) -> None:
    """Issue 16: the share of '#### N' answers is drawn next to the rule score (accuracy), so a
    policy that learns the format without the answers shows as a gap between the two curves."""
    sink = JsonlSink(tmp_path / "metrics.jsonl")
    for step, (fmt, rule) in enumerate(((0.4, 0.1), (1.0, 0.2)), 1):
        sink.log({"critic/score/mean": rule, "reward/answer_format/mean": fmt, "reward/rule_score/mean": rule},
                 step=step)
    sink.close()
    panels = dict(panel_series(read_metrics(tmp_path)))
    assert panels["Answer format and rule score"] == {"reward/answer_format/mean": [(1.0, 0.4), (2.0, 1.0)],
                                                      "reward/rule_score/mean": [(1.0, 0.1), (2.0, 0.2)]}


def test_read_metrics_errors_name_the_file_and_line(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="run folder not found"):
        read_metrics(tmp_path / "missing")
    with pytest.raises(UserError, match="no metrics.jsonl"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"step": 1, "a": 1}\n{not json\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:2: expected one JSON object per line, got invalid JSON"):
        read_metrics(tmp_path)
    (tmp_path / "metrics.jsonl").write_text('{"a": 1}\n')
    with pytest.raises(UserError, match=r"metrics.jsonl:1: expected an object with a numeric 'step'"):
        read_metrics(tmp_path)


def test_monitor_alarms_mark_the_curves_instead_of_a_panel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An alarm logged by the training monitor (``monitor/alarm/<name>: 1`` at its step) is drawn
    as a vertical line at that step on every curve panel, not as a panel of its own."""
    from matplotlib.axes import Axes

    from alignctl.eval import plots

    sink = JsonlSink(tmp_path / "metrics.jsonl")
    for step, entropy in enumerate((2.0, 1.9, 0.1, 0.05), 1):
        sink.log({"actor/entropy": entropy, "response_length/mean": 10.0, "monitor/unique_in_batch": 0.9,
                  **({"monitor/alarm/entropy_collapse": 1.0} if step == 3 else {})}, step=step)
    sink.close()
    panels = panel_series(read_metrics(tmp_path))
    assert [t for t, _ in panels][-1] == "Monitor alarms"
    marked: list[tuple[float, str]] = []
    real_axvline = Axes.axvline

    def spy(ax, x, *args, **kwargs):
        marked.append((x, kwargs.get("label")))
        return real_axvline(ax, x, *args, **kwargs)

    monkeypatch.setattr(Axes, "axvline", spy)  # a spy: the real line is still drawn
    png = plots.training_curves(panels)
    assert png.startswith(b"\x89PNG")
    # three panels drawn (entropy, length, diversity), each marked once at step 3
    assert marked == [(3.0, "alarm: entropy_collapse")] * 3
