"""What a person sees while a run goes: one line per RL step with a count and an ETA, the running
stages' steps under ``alignctl run``, and plain lines now and then when output is piped."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console

from alignctl import console as console_module
from alignctl.pipeline.concurrent import latest_step
from alignctl.tracking import StepLineSink, duration_text, step_line, validation_line
from conftest import run_cli
from rl_helpers import make_assets

STEP = re.compile(r"^step (\d+)/(\d+) · ([\d.]+) s/step · ETA (\S+)")


def test_duration_text_by_hand():
    assert [duration_text(s) for s in (0, 45, 60, 400, 3599, 3600, 3720)] == \
        ["0s", "45s", "1m00s", "6m40s", "59m59s", "1h00m", "1h02m"]


def test_step_line_has_count_pace_eta_and_the_watched_numbers():
    metrics = {"critic/score/mean": 0.41, "reward/rule_score/mean": 0.55, "reward/rm_score/mean": 1.2,
               "actor/reference_kl": 0.012, "response_length/mean": 23.4, "monitor/alarm/length_collapse": 1.0,
               "actor/pg_loss": 0.3}
    # 13 steps left at 31 s each: 403 s = 6m43s
    assert step_line(metrics, 7, 20, 31.0) == \
        "step 7/20 · 31 s/step · ETA 6m43s · reward 0.41 · gold 0.55 · kl 0.012 · len 23.4 · ALARM length_collapse"
    # without a reward model the rule score is the reward itself: no separate gold
    assert "gold" not in step_line({"critic/score/mean": 0.5, "reward/rule_score/mean": 0.5}, 1, 2, 1.0)
    assert step_line({}, 3, None, None) == "step 3"
    assert validation_line({"val-core/arith/acc/mean@1": 0.25, "timing_s/validation": 3.0}, 10, 20) == \
        "validation at step 10/20: arith/acc/mean@1 0.25"


def test_step_line_sink_times_the_steps_it_sees():
    """Seconds per step: the mean of the last 5 training-step intervals; a validation row is not one."""
    now = [100.0]
    out = io.StringIO()
    sink = StepLineSink(10, Console(file=out, width=200), clock=lambda: now[0])
    for step, gap in enumerate((10.0, 20.0), 1):
        now[0] += gap
        sink.log({"critic/score/mean": 0.0}, step)
    now[0] += 99.0  # a validation pass: printed, not counted, and the next interval starts after it
    sink.log({"val-core/a/acc/mean@1": 0.5}, 2)
    now[0] += 30.0
    sink.log({"critic/score/mean": 0.0}, 3)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("step 1/10 · 10 s/step · ETA 1m30s")
    assert lines[1].startswith("step 2/10 · 15 s/step · ETA 2m00s")
    assert lines[2] == "validation at step 2/10: a/acc/mean@1 0.5"
    assert lines[3].startswith("step 3/10 · 20 s/step · ETA 2m20s")  # (10 + 20 + 30) / 3 x 7


def test_latest_step_reads_a_stage_log(tmp_path: Path):
    log = tmp_path / "grpo.log"
    assert latest_step(log) is None  # not written yet
    log.write_text("── grpo (grpo) · stage 8 of 12 ──\nseeds: trainer.seed=0\n")
    assert latest_step(log) is None
    log.write_text(log.read_text() + "step 6/20 · 30 s/step · ETA 7m00s · reward 0.3\n"
                   "step 7/20 · 31 s/step · ETA 6m43s · reward 0.4 · len 20\nvalidation at step 7/20: x 1\n")
    assert latest_step(log) == "step 7/20 · ETA 6m43s"


def test_piped_loops_print_a_plain_line_now_and_then(monkeypatch: pytest.MonkeyPatch, capsys):
    ticks = iter(range(0, 1000, 10))  # each item takes 10 s on this clock
    monkeypatch.setattr(console_module, "_plain_lines", True)
    items = list(console_module._plain_periodic(range(10), "scoring", None, clock=lambda: next(ticks)))
    assert items == list(range(10))
    lines = capsys.readouterr().err.splitlines()
    assert lines == ["scoring: 3/10 (30s)", "scoring: 6/10 (60s)", "scoring: 9/10 (90s)"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_assets(tmp_path_factory.mktemp("progress"))


def test_grpo_with_only_a_model_and_data_runs_and_prints_a_line_per_step(assets, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch):
    """The bare `alignctl grpo` (its own defaults valid for GRPO: a group of responses per prompt) with
    the two required paths; the rest only shrinks the run. Each step is one line with count and ETA."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("ALIGNCTL_VERBOSE", raising=False)
    result = run_cli("grpo", f"actor_rollout_ref.model.path={assets['model']}",
                     f"data.train_files=[{assets['data'] / 'train.parquet'}]",
                     "trainer.total_training_steps=3", "data.max_response_length=16",
                     "trainer.stop_on_flat_reward=false")  # a random tiny model earns the same reward 0 everywhere
    assert result.code == 0, result.stderr
    steps = [STEP.match(line) for line in result.stdout.splitlines() if line.startswith("step ")]
    assert [m and (int(m[1]), int(m[2])) for m in steps] == [(1, 3), (2, 3), (3, 3)], result.stdout
    assert all(float(m[3]) > 0 for m in steps)
    assert steps[-1][4] == "0s"  # nothing left after the last step
    assert "actor/pg_loss" not in result.stdout  # the full table is --verbose's
    assert (tmp_path / "runs").exists()


def test_verbose_turns_the_step_line_into_the_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    from alignctl.tracking import VERBOSE_ENV, ConsoleSink, Tracker

    def console_sink(**env: str):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        tracker = Tracker.create(["console", "jsonl"], tmp_path, project="p", name="n", config={}, total_steps=5)
        tracker.close()
        return type(tracker.sinks[1])

    monkeypatch.delenv(VERBOSE_ENV, raising=False)
    assert console_sink() is StepLineSink
    assert console_sink(**{VERBOSE_ENV: "1"}) is ConsoleSink


def test_piped_side_by_side_run_prints_the_running_stages_steps(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                capsys):
    """Spinner lines off (not a terminal): a plain line names each running stage's latest step and ETA."""
    import subprocess
    import sys

    from alignctl.console import running_lines
    from alignctl.pipeline import concurrent

    monkeypatch.setattr(concurrent, "_PLAIN_EVERY_S", 0.0)
    log = tmp_path / "grpo.log"
    log.write_text("step 7/20 · 31 s/step · ETA 6m43s · reward 0.4\n")
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    running = [concurrent._Running(concurrent.Job("grpo", 1, ()), [0], process, log),
               concurrent._Running(concurrent.Job("ppo", 1, ()), [1], process, tmp_path / "ppo.log")]
    bars = running_lines(enabled=False)
    concurrent._Ticker().show(running, bars)
    out = capsys.readouterr().out
    assert re.search(r"running \(\d+s\): grpo step 7/20 · ETA 6m43s; ppo starting", out), out
