"""Stages side by side (``cpu_share`` in pipeline files, pipeline/concurrent.py): which stage starts when,
on how many cores, and what a failing stage does to the others. Real stage processes on cheap real
stages (preprocess, init-model), real ``sched_setaffinity``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alignctl.cores import available_cores
from alignctl.errors import RunFailed, UserError
from alignctl.pipeline import concurrent
from alignctl.pipeline.concurrent import Job, next_job, simulate, stage_cores
from alignctl.pipeline.runner import load, run_pipeline
from conftest import REPO_ROOT, assert_user_error, run_cli

PIPELINE = """
workdir: {workdir}
stages:
  data:
    kind: preprocess
    cpu_share: 0.5
    config: {{dataset: arith, seed: 0, arith: {{num_train: 20, num_test: 5, num_sft: 20, num_pref: 5}}}}
  other:
    kind: preprocess
    cpu_share: 0.5
    config: {{dataset: arith, seed: 1, arith: {{num_train: 10, num_test: 5, num_sft: 0, num_pref: 0}}}}
  model:
    kind: init-model
    config: {{tokenizer_from: ["${{data}}/sft_train.parquet"], tokenizer_kind: char, hidden: 32, layers: 1}}
"""

two_cores = pytest.mark.skipif(available_cores() < 2, reason="needs 2 CPU cores to run two stages side by side")


def test_stage_cores_are_whole_cores_of_the_share():
    # By hand: floor(share x cores), at least 1, at most every core.
    assert [stage_cores(s, 2) for s in (0.5, 1.0, 0.3, 0.99)] == [1, 2, 1, 1]
    assert [stage_cores(s, 16) for s in (0.5, 0.25, 1 / 3, 0.01, 1.0)] == [8, 4, 5, 1, 16]
    assert stage_cores(0.5, 1) == 1


def test_next_job_takes_the_first_ready_job_that_fits():
    a, b = Job("a", 1, ()), Job("b", 1, ("a",))
    full, late = Job("full", 2, ()), Job("late", 1, ())
    assert next_job([a, b], set(), 2) is a
    assert next_job([b], set(), 2) is None  # its input is not built
    assert next_job([b], {"a"}, 1) is b
    # A job needing both cores waits while one is busy; a later job that fits goes first.
    assert next_job([full, late], set(), 1) is late
    assert next_job([full, late], set(), 2) is full
    assert next_job([full], set(), 0) is None


@pytest.mark.parametrize("value", ["0", "1.5", "half", "true", "-0.5"])
def test_a_bad_cpu_share_is_one_line_naming_the_stage(tmp_path, value):
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE.format(workdir=tmp_path / "work").replace("cpu_share: 0.5\n    config: {dataset: arith, seed: 1",
                                                                       f"cpu_share: {value}\n    config: {{dataset: arith, seed: 1"))
    result = run_cli("run", str(path))
    assert_user_error(result, str(path), "stage 'other'", "'cpu_share' expected a number in (0, 1]")
    assert not (tmp_path / "work").exists()


def test_cpu_share_from_the_command_line(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE.format(workdir=tmp_path / "work"))
    assert load(path, ["data.cpu_share=1"]).stages["data"].cpu_share == 1.0
    assert load(path, []).stages["data"].cpu_share == 0.5 and load(path, []).stages["model"].cpu_share == 1.0
    with pytest.raises(UserError, match=r"override 'data.cpu_share=lots'.*'cpu_share' expected a number"):
        load(path, ["data.cpu_share=lots"])


@two_cores
def test_stages_with_half_shares_run_side_by_side_on_one_core_each(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE.format(workdir=tmp_path / "work"))
    result = run_cli("run", str(path))
    assert result.code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.startswith(("started", "finished")) or
             "model (init-model)" in line]
    # Both half-share stages start before either ends (the scheduler starts every job that fits
    # before it waits); the full-share model runs in this process (its report in this output), after
    # both: it needs every core.
    assert [line.split()[:2] for line in lines[:2]] == [["started", "data"], ["started", "other"]]
    assert {line.split()[1] for line in lines[2:4]} == {"data", "other"} and "model (init-model)" in lines[4]
    manifests = {p.name.split("-")[0]: json.loads((p / "manifest.json").read_text())
                 for p in (tmp_path / "work").iterdir() if (p / "manifest.json").exists()}
    assert {name: m["cpu_cores"] for name, m in manifests.items()} == {"data": 1, "other": 1,
                                                                       "model": available_cores()}
    logs = sorted(p.name.split("-")[0] for p in (tmp_path / "work" / "logs").glob("*.log"))
    assert logs == ["data", "other"]
    # Run again: every stage cached, none started.
    again = run_cli("run", str(path))
    assert again.code == 0 and "started" not in again.stdout and again.stdout.count("cached") >= 3


def test_sequential_runs_in_this_process_on_every_core(tmp_path):
    path = tmp_path / "p.yaml"
    path.write_text(PIPELINE.format(workdir=tmp_path / "work"))
    outcomes = run_pipeline(load(path, []), sequential=True)
    assert [o.name for o in outcomes] == ["data", "other", "model"] and {o.state for o in outcomes} == {"ran"}
    assert {json.loads((o.path / "manifest.json").read_text())["cpu_cores"] for o in outcomes} == {available_cores()}
    assert not (tmp_path / "work" / "logs").exists()


def _launch_command(commands: dict[str, list[str]], log_dir: Path):
    """A launcher that starts ``commands[job]`` as the job's process (the real scheduler around it)."""
    def launch(job: Job, cores: list[int]) -> concurrent._Running:
        log = log_dir / f"{job.name}.log"
        with log.open("wb") as handle:
            process = subprocess.Popen(commands[job.name], stdout=handle, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        return concurrent._Running(job, cores, process, log)
    return launch


def test_a_failing_stage_stops_the_others_and_its_error_line_is_the_runs(tmp_path):
    commands = {"slow": [sys.executable, "-c", "import time; time.sleep(60)"],
                "bad": [sys.executable, "-c", "import sys; print('working'); "
                        "print('error: rows.jsonl row 3: expected a prompt'); sys.exit(2)"],
                "after": [sys.executable, "-c", "pass"]}
    jobs = [Job("slow", 1, ()), Job("bad", 1, ()), Job("after", 1, ("bad",))]
    started: list[str] = []
    launch = _launch_command(commands, tmp_path)

    def tracking(job, cores):
        started.append(job.name)
        return launch(job, cores)

    begin = time.monotonic()
    if available_cores() < 2:
        jobs = jobs[1:]
    with pytest.raises(UserError, match=r"stage 'bad' failed: rows.jsonl row 3: expected a prompt \(log: "):
        concurrent.run_jobs(jobs, set(), tracking, lambda item: None, poll_s=0.05)
    assert "after" not in started  # nothing downstream of the failure starts
    assert time.monotonic() - begin < 30  # the 60-second sibling was stopped, not waited for


@two_cores
def test_a_job_taking_every_core_runs_here_once_the_others_are_done(tmp_path):
    commands = {name: [sys.executable, "-c", "import time; time.sleep(0.5)"] for name in ("a", "b", "late")}
    events: list[str] = []
    launch = _launch_command(commands, tmp_path)

    def tracking(job, cores):
        events.append(f"start {job.name} {len(cores)}")
        return launch(job, cores)

    jobs = [Job("a", 1, ()), Job("whole", available_cores(), ("a",)), Job("b", 1, ()), Job("late", 1, ("whole",))]
    concurrent.run_jobs(jobs, set(), tracking, lambda job: events.append(f"done {job.name}"),
                        run_here=lambda job: events.append(f"here {job.name}"), poll_s=0.05)
    assert events[:2] == ["start a 1", "start b 1"]
    here = events.index("here whole")
    assert {"done a", "done b"} <= set(events[:here])  # every core free before it runs
    assert events[here + 1:] == ["done whole", "start late 1", "done late"]


def test_a_crashing_stage_is_a_run_failure_exit_1(tmp_path):
    commands = {"crash": [sys.executable, "-c", "raise SystemExit(1)"]}
    with pytest.raises(RunFailed, match=r"stage 'crash' failed: exit status 1"):
        concurrent.run_jobs([Job("crash", 1, ())], set(), _launch_command(commands, tmp_path), lambda item: None,
                            poll_s=0.05)


def test_pinned_process_sees_its_cores_only():
    """What a stage process on one core gets: one core for 'auto' worker sizes, one torch thread."""
    first = min(os.sched_getaffinity(0))
    code = ("from alignctl.cores import pin_to_cores, available_cores; "
            f"pin_to_cores([{first}]); import torch, os; "
            "from alignctl.config.placement import auto_cpus_per_worker; "
            "print(available_cores(), auto_cpus_per_worker(1), torch.get_num_threads(), os.environ['OMP_NUM_THREADS'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["1", "1", "1", "1"]


TERMINATED_PARENT = """
import subprocess, sys, time
from pathlib import Path
from alignctl.pipeline import concurrent
from alignctl.pipeline.concurrent import Job

def launch(job, cores):
    log = Path(sys.argv[1]) / (job.name + ".log")
    with log.open("wb") as handle:
        process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], stdout=handle,
                                   start_new_session=True)
    print(process.pid, flush=True)
    return concurrent._Running(job, cores, process, log)

concurrent.run_jobs([Job("slow", 1, ())], set(), launch, lambda item: None, poll_s=0.05)
"""


def test_a_terminated_run_stops_its_stage_processes(tmp_path):
    """SIGTERM to ``alignctl run`` (a scheduler, a shell's kill) ends the stages with it, not orphans."""
    parent = subprocess.Popen([sys.executable, "-c", TERMINATED_PARENT, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    os.kill(parent.pid, 15)
    assert parent.wait(timeout=30) == 128 + 15
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.1)
    else:
        os.kill(child, 9)
        pytest.fail("the stage process outlived the terminated run")


def _simulated_starts(jobs: list[Job], seconds: dict[str, float], cores: int) -> tuple[dict[str, float], float]:
    """Start time of each job and the end of the last one (concurrent.simulate, the dry run's replay)."""
    times = simulate(jobs, seconds, cores)
    return {name: start for name, (start, _) in times.items()}, max(end for _, end in times.values())


def test_quickstart_file_order_starts_grpo_beside_the_reward_model_and_the_judge_in_ppos_place(tmp_path):
    """On 2 cores the quickstart's file order decides which ready half-share stage goes first. The
    stage times are the ones measured in seed 0's side-by-side run (docs/quickstart.md, 2026-12-01);
    with them, by hand: GRPO starts with the reward model (not 40 s after it, behind the judge), PPO
    takes the reward model's core when it ends, and the judge takes PPO's core while GRPO finishes,
    so the evals start 40 + 695 + 40 = 775 s after the two verifiers, where the file's earlier order
    (the judge before GRPO) started them at 40 + 769 = 809 s."""
    spec = load(REPO_ROOT / "pipelines" / "quickstart.yaml", [f"workdir={tmp_path / 'work'}"])
    seconds = {"base_model": 9, "data": 0, "judge_data": 0, "sft": 52, "verifier": 110, "judge_verifier": 54,
               "reward_model": 40, "judge": 40, "grpo": 769, "ppo": 695, "eval_grpo": 86, "eval_ppo": 68}
    jobs = [Job(name, stage_cores(stage.cpu_share, 2), tuple(stage.upstream)) for name, stage in spec.stages.items()]
    starts, end = _simulated_starts(jobs, seconds, cores=2)
    rl_start = starts["reward_model"]
    assert rl_start == 9 + 0 + 0 + 52 + 110 + 54
    assert starts["grpo"] == rl_start and starts["ppo"] == rl_start + 40
    assert starts["judge"] == rl_start + 40 + 695
    assert starts["eval_grpo"] == rl_start + 775 and starts["eval_ppo"] == starts["eval_grpo"] + 86
    assert end == rl_start + 775 + 86 + 68
    judge = next(job for job in jobs if job.name == "judge")
    earlier = [job for job in jobs if job is not judge]
    earlier.insert([job.name for job in earlier].index("grpo"), judge)
    old_starts, old_end = _simulated_starts(earlier, seconds, cores=2)
    assert (old_starts["judge"], old_starts["grpo"]) == (rl_start, rl_start + 40)
    assert old_end - end == 34
