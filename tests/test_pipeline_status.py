"""``alignctl status``: one screen at 80 columns, RL headlines with reward and accuracy at the start
and the end, and warnings for stages whose numbers look wrong."""

from __future__ import annotations

from pathlib import Path

from alignctl.pipeline.summary import concerns, headline, run_digest, status_lines


def _rl_rows() -> list[dict[str, float]]:
    rows = [{"step": 0, "val-core/arith/acc/mean@1": 0.2}]
    for step, reward in enumerate([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8], 1):
        rows.append({"step": step, "critic/score/mean": reward, "reward/rule_score/mean": reward / 2,
                     "reward/rm_score/mean": 1.0})
    rows[5]["monitor/alarm/length_collapse"] = 1.0
    return rows


def test_run_digest_by_hand():
    """8 steps: the first and last quarter are 2 steps each; the rule score is the gold beside an RM."""
    digest = run_digest(_rl_rows())
    assert digest["reward/start"] == (0.1 + 0.2) / 2 and digest["reward/end"] == (0.7 + 0.8) / 2
    assert digest["gold/start"] == (0.05 + 0.1) / 2 and digest["gold/end"] == (0.35 + 0.4) / 2
    assert digest["alarms"] == ["length_collapse"]


def test_rl_headline_and_warnings():
    metrics = {"steps": 8, "before/val-core/arith/acc/mean@1": 0.2, "after/val-core/arith/acc/mean@1": 0.15,
               **run_digest(_rl_rows())}
    assert headline("grpo", metrics) == "reward 0.150 -> 0.750, val acc 0.200 -> 0.150, alarm: length_collapse"
    assert concerns("grpo", metrics) == ["alarm fired: length_collapse", "arith acc mean@1 fell 0.200 -> 0.150"]
    assert concerns("sft", {"train/loss_start": 0.073, "train/loss_end": 0.282}) == ["train loss rose 0.073 -> 0.282"]
    assert concerns("sft", {"train/loss_start": 0.9, "train/loss_end": 0.3}) == []


def test_eval_headline_leads_with_accuracy_then_the_judge():
    metrics = {"accuracy/arith/pass@1": 0.61, "reference_accuracy/arith/pass@1": 0.48, "win_rate": 0.7,
               "judge_win_rate": 0.608, "judge_win_rate_ci_low": 0.558, "judge_win_rate_ci_high": 0.652}
    assert headline("eval", metrics) == ("pass@1 0.480 -> 0.610 (+13.0 pts), judge win rate 0.608 [0.558, 0.652], "
                                         "RM win rate 0.700")


def test_status_of_twelve_stages_fits_one_80_column_screen():
    kinds = ["import-model", "preprocess", "preprocess", "sft", "sft", "sft", "train-rm", "grpo", "ppo", "train-rm",
             "eval", "eval"]
    names = ["base_model", "data", "judge_data", "sft", "verifier", "judge_verifier", "reward_model", "grpo", "ppo",
             "judge", "eval_grpo", "eval_ppo"]
    rl = {"steps": 20, **run_digest(_rl_rows())}
    metrics = {"sft": {"train/loss_start": 0.9, "train/loss_end": 0.3}, "grpo": rl, "ppo": rl,
               "judge_verifier": {"train/loss_start": 0.073, "train/loss_end": 0.282},
               "eval_grpo": {"accuracy/arith/pass@1": 0.61, "reference_accuracy/arith/pass@1": 0.48,
                             "judge_win_rate": 0.608, "judge_win_rate_ci_low": 0.558, "judge_win_rate_ci_high": 0.652}}
    stages = [(n, k, "cached", metrics.get(n, {"num_parameters": 134515008})) for n, k in zip(names, kinds)]
    lines = status_lines("pipelines/quickstart.yaml", Path("/w"), stages, width=80)
    assert len(lines) <= 24 and all(len(line) <= 80 for line in lines), "\n".join(lines)
    assert lines[0] == "pipelines/quickstart.yaml: 12 cached"
    grpo = next(line for line in lines if line.startswith("grpo "))
    assert "reward 0.150 -> 0.750" in grpo
    assert "warnings:" in lines
    assert "  judge_verifier: train loss rose 0.073 -> 0.282" in lines
    assert "  grpo: alarm fired: length_collapse" in lines
