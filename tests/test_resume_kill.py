"""A job SIGKILLed at three different points and resumed each time logs exactly the metrics of an
uninterrupted run, step for step (timings aside), and ends with exactly its weights.

Real processes: each launch is a fresh Python process (tests/drivers/kill_at.py) in its own session
running the controller, a local Ray cluster and two ddp workers; the kill takes the whole process
group, like a preemption. The data has 8 prompts in batches of 4, so an epoch is 2 steps.

    launch 1: killed in step 2, after the actor update        -> resumes from step 1
    launch 2: killed writing step 3's checkpoint (not commited) -> resumes from step 2 (epoch boundary)
    launch 3: killed just after committing step 4 (epoch end)  -> resumes from step 4 (epoch boundary)
    launch 4: runs steps 5-6 to the end
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from alignctl.trainers.checkpoint_folders import complete_checkpoints
from rl_helpers import launch_kill_driver, make_assets, read_metrics

pytestmark = pytest.mark.slow

TIME_DEPENDENT = ("timing_s/", "perf/")


def _overrides(assets: dict[str, Path], run_dir: Path) -> list[str]:
    return [
        f"data.train_files=[{assets['data'] / 'train.parquet'}]", f"data.val_files=[{assets['data'] / 'test.parquet'}]",
        f"actor_rollout_ref.model.path={assets['model']}", f"custom_reward_function.path={assets['reward']}",
        f"trainer.run_dir={run_dir}", "algorithm.adv_estimator=grpo",
        "data.train_batch_size=4", "data.max_prompt_length=128", "data.max_response_length=16",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.optim.lr=1e-3",
        # State that must survive: adaptive KL controller, shuffled mini-batches, the LR schedule.
        "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0.01",
        "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.shuffle=true",
        "actor_rollout_ref.actor.optim.lr_warmup_steps=2", "actor_rollout_ref.actor.optim.warmup_style=cosine",
        "trainer.total_training_steps=6", "trainer.save_freq=1", "trainer.test_freq=2", "trainer.n_gpus_per_node=2",
        "trainer.logger=[jsonl]", "trainer.val_before_train=true",
    ]


def _deterministic(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(TIME_DEPENDENT)} for row in rows]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "actor" / "model.safetensors"))


def test_sigkill_at_three_points_then_resume_equals_uninterrupted(tmp_path: Path):
    assets = make_assets(tmp_path / "assets", num_train=8, num_test=8)
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = launch_kill_driver("none", _overrides(assets, whole))
    assert done.returncode == 0, done.stderr[-3000:]

    plan = [("mid_step:2", [1]), ("checkpoint_write:3", [1, 2]), ("after_commit:4", [1, 2, 3, 4])]
    for kill, checkpoints_after in plan:
        run = launch_kill_driver(kill, _overrides(assets, killed))
        assert run.returncode == -signal.SIGKILL, (kill, run.stderr[-3000:])
        assert [s for s, _ in complete_checkpoints(killed / "checkpoints")] == checkpoints_after, kill
    partial_left = [p.name for p in (killed / "checkpoints").iterdir() if p.name.startswith(".partial")]
    assert partial_left == []  # launch 3 cleaned launch 2's interrupted write
    final = launch_kill_driver("none", _overrides(assets, killed))
    assert final.returncode == 0, final.stderr[-3000:]
    assert "resuming from" in final.stdout and "step 4" in final.stdout

    expected, got = read_metrics(whole), read_metrics(killed)
    assert [r["step"] for r in got] == [r["step"] for r in expected] == [0, 1, 2, 2, 3, 4, 4, 5, 6, 6]
    assert _deterministic(got) == _deterministic(expected)  # exact floats, every step after every kill
    assert [r["training/epoch"] for r in got if "training/epoch" in r] == [0, 0, 1, 1, 2, 2]
    a, b = _weights(whole), _weights(killed)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
