"""Faults: a worker process killed mid-run ends the run within 60 s with a message naming the role
and the step, and exit status 1 (real subprocess, real SIGKILL of a Ray worker)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alignctl.trainers.checkpoint_folders import complete_checkpoints
from rl_helpers import make_assets

pytestmark = pytest.mark.slow


def test_killed_worker_fails_the_run_fast_and_names_role_and_step(tmp_path: Path):
    assets = make_assets(tmp_path / "assets")
    run_dir = tmp_path / "run"
    args = [sys.executable, "-m", "alignctl", "grpo",
            f"data.train_files=[{assets['data'] / 'train.parquet'}]", f"actor_rollout_ref.model.path={assets['model']}",
            f"custom_reward_function.path={assets['reward']}", f"trainer.run_dir={run_dir}",
            "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=2",
            "data.max_response_length=16", "trainer.total_training_steps=1000", "trainer.n_gpus_per_node=2",
            "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.save_freq=1"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ})
    try:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.time() + 180
        while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 2):
            time.sleep(0.5)
        assert metrics.exists(), "the run never reached step 2"
        workers = json.loads((run_dir / "workers.json").read_text())
        assert [w["rank"] for w in workers] == [0, 1] and all("actor" in w["roles"] for w in workers)
        assert all(w["heap_kept"] is True for w in workers)  # CPU workers keep freed heap memory (cpu_heap)
        os.kill(workers[1]["pid"], signal.SIGKILL)
        killed_at = time.time()
        _, stderr = proc.communicate(timeout=90)
        elapsed = time.time() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-2000:]
    assert elapsed < 60
    # Ray may forward the surviving worker's own gloo error after ours: take our one-line error.
    ours = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1, stderr[-2000:]
    last = ours[0]
    assert "'actor' worker" in last and "died" in last, last
    logged = [json.loads(line)["step"] for line in metrics.read_text().splitlines()]
    saving = last.startswith("error: saving the step ")
    if saving:  # killed while the step's checkpoint was written: that one never became complete
        assert int(last.split()[4]) == max(logged)
        step = max(logged) + 1
    else:
        assert last.startswith("error: step "), last
        step = int(last.split()[2].rstrip(":"))
        assert step == max(logged) + 1  # the step that was running when the worker died

    # The last complete checkpoint stays loadable: the same command, auto-resumed, runs one more step.
    last_saved = complete_checkpoints(run_dir / "checkpoints")[-1][0]
    assert last_saved == (max(logged) - 1 if saving else max(logged))
    resumed = subprocess.run([*args[:-1], "trainer.save_freq=-1", f"trainer.total_training_steps={last_saved + 1}",
                              "trainer.n_gpus_per_node=2"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from {run_dir / 'checkpoints' / f'global_step_{last_saved}'}" in " ".join(resumed.stdout.split())
    assert [json.loads(line)["step"] for line in metrics.read_text().splitlines()][-1] == last_saved + 1
