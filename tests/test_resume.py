"""Checkpoint / resume: the folder protocol (pure file-system tests) and exact resumption of real
two-worker runs for every training backend: a run resumed from its step-2 checkpoint logs exactly
the metrics (bit for bit, timings aside) and ends with exactly the weights of the uninterrupted run.

The SIGKILL tests (a real kill of the whole job at several points) are in test_resume_kill.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from alignctl.errors import UserError
from alignctl.trainers.checkpoint_folders import (LATEST_FILE, STATE_FILE, commit, complete_checkpoints, read_metric_rows,
                                          remove_partials, resolve_resume, start_partial, truncate_metrics, write_state)
from alignctl.trainers.rl_trainer import RLTrainer
from rl_helpers import make_assets, read_metrics, rl_config

# ---------------------------------------------------------------------------------------------- folder protocol


def _save(root: Path, step: int, keep: int | None = None) -> Path:
    partial = start_partial(root, step)
    (partial / "actor").mkdir()
    write_state(partial, {"global_step": step})
    return commit(partial, root, step, keep)


def test_commit_renames_into_place_and_keeps_the_newest_k(tmp_path: Path):
    root = tmp_path / "checkpoints"
    for step in (1, 2, 3, 4):
        _save(root, step, keep=2)
    assert [s for s, _ in complete_checkpoints(root)] == [3, 4]
    assert sorted(p.name for p in root.iterdir()) == sorted([LATEST_FILE, "global_step_3", "global_step_4"])
    assert (root / LATEST_FILE).read_text().strip() == "4"


def test_interrupted_write_is_never_resumed_from_and_is_cleaned(tmp_path: Path):
    root = tmp_path / "checkpoints"
    _save(root, 2)
    partial = start_partial(root, 4)  # killed before the commit: even a complete-looking state file
    write_state(partial, {"global_step": 4})
    assert resolve_resume("auto", root) == root / "global_step_2"
    remove_partials(root)
    assert [p.name for p in root.iterdir() if p.is_dir()] == ["global_step_2"]


def test_a_step_folder_without_state_is_incomplete(tmp_path: Path):
    root = tmp_path / "checkpoints"
    _save(root, 1)
    (root / "global_step_9").mkdir()  # e.g. copied by hand, half-way
    assert resolve_resume("auto", root) == root / "global_step_1"


def test_critic_state_from_before_the_token_classification_critic_is_refused(tmp_path: Path):
    """Critic checkpoints of the old layout (backbone.* + value_head.*) cannot be read into the
    token-classification critic: one line saying so, before any weights are touched."""
    from types import SimpleNamespace

    from alignctl.workers.critic import CriticWorker

    (tmp_path / "dcp").mkdir()  # what an old critic folder held: weights, no layout file
    untouched = SimpleNamespace()  # no engine: the check must come first
    with pytest.raises(UserError) as exc:
        CriticWorker.load_checkpoint(untouched, str(tmp_path))  # type: ignore[arg-type]
    assert "\n" not in str(exc.value) and "older alignctl" in str(exc.value)
    assert "resume_mode=disable" in str(exc.value)


def test_resume_modes(tmp_path: Path):
    root = tmp_path / "checkpoints"
    assert resolve_resume("auto", root) is None  # fresh start
    _save(root, 3)
    assert resolve_resume("disable", root) is None
    assert resolve_resume(str(root / "global_step_3"), root) == root / "global_step_3"
    with pytest.raises(UserError, match="not a complete checkpoint"):
        resolve_resume(str(tmp_path / "nope"), root)


def test_metrics_are_truncated_to_the_checkpoint_step_and_a_torn_line_dropped(tmp_path: Path):
    path = tmp_path / "metrics.jsonl"
    rows = [{"step": 0, "val-core/a": 0.5}, {"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}, {"step": 3, "x": 3.0}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 4, "x"')
    assert len(read_metric_rows(path)) == 4
    assert truncate_metrics(path, 2) == rows[:3]
    assert read_metric_rows(path) == rows[:3]


# ---------------------------------------------------------------------------------------------- exact resumption

pytest_slow = pytest.mark.slow

TIME_DEPENDENT = ("timing_s/", "perf/")


def deterministic(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(TIME_DEPENDENT)}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("resume"))


def _policy_state(run_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(run_dir / "actor" / "model.safetensors"))


BACKENDS = {
    # PPO with every piece of controller and worker state in play: critic, adaptive KL controller
    # (KL in reward), two PPO epochs over shuffled mini-batches, warm-up + cosine LR schedules.
    "ddp-ppo": ["algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive",
                "algorithm.kl_ctrl.target_kl=0.01", "algorithm.kl_ctrl.horizon=100",
                "actor_rollout_ref.actor.ppo_epochs=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
                "actor_rollout_ref.actor.shuffle=true",
                "actor_rollout_ref.actor.optim.lr_warmup_steps=2", "actor_rollout_ref.actor.optim.warmup_style=cosine",
                "critic.optim.lr_warmup_steps=1"],
    "fsdp2-grpo": ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.use_kl_loss=true",
                   "actor_rollout_ref.actor.optim.lr_warmup_steps=2"],
    # fsdp2 with CPUOffloadPolicy on the actor and the reference: the checkpoint holds CPU-offloaded
    # shards and AdamW state and loads them back into offloaded units.
    "fsdp2-offload-grpo": ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.use_kl_loss=true",
                           "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
                           "actor_rollout_ref.ref.fsdp_config.param_offload=true"],
    "deepspeed3-grpo": ["actor_rollout_ref.actor.strategy=deepspeed", "actor_rollout_ref.actor.deepspeed.zero_stage=3",
                        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.optim.lr_warmup_steps=2"],
}


@pytest_slow
@pytest.mark.parametrize("backend", list(BACKENDS))
def test_resumed_run_equals_the_uninterrupted_one(assets, tmp_path: Path, backend: str):
    common = ["trainer.n_gpus_per_node=2", "trainer.total_training_steps=4", "trainer.save_freq=2",
              "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2", *BACKENDS[backend]]
    whole = tmp_path / "whole"
    RLTrainer(rl_config(assets, whole, *common)).fit()
    checkpoints = complete_checkpoints(whole / "checkpoints")
    assert [s for s, _ in checkpoints] == [2, 4]
    assert (checkpoints[0][1] / STATE_FILE).is_file()

    resumed = tmp_path / "resumed"
    result = RLTrainer(rl_config(assets, resumed, *common, f"trainer.resume_mode={checkpoints[0][1]}")).fit()
    assert result.steps == 4
    expected = [deterministic(r) for r in read_metrics(whole) if r["step"] > 2]
    got = [deterministic(r) for r in read_metrics(resumed)]
    assert [r["step"] for r in got] == [3, 4]
    assert got == expected  # exact: same floats, not approximately
    if backend == "ddp-ppo":
        # One LR-schedule step per RL step (4 optimizer steps each here), by hand: warm-up 2 steps
        # (1/2, 2/2 of 1e-3), then cosine over the remaining 2: cos factor 1 at step 3, 0.5 at step 4.
        lrs = [r["actor/lr"] for r in read_metrics(whole)]
        assert lrs == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4], rel=1e-12)
    final_whole, final_resumed = _policy_state(whole), _policy_state(resumed)
    assert all(torch.equal(final_whole[k], final_resumed[k]) for k in final_whole)


@pytest_slow
def test_auto_resume_continues_in_the_run_folder_and_reports_a_worker_count_change(assets, tmp_path: Path):
    run = tmp_path / "run"
    common = ["trainer.save_freq=1", "trainer.max_ckpt_to_keep=1", "actor_rollout_ref.actor.use_kl_loss=true"]
    RLTrainer(rl_config(assets, run, *common, "trainer.total_training_steps=2")).fit()
    assert [s for s, _ in complete_checkpoints(run / "checkpoints")] == [2]
    # Same folder, a longer run: auto picks up step 2 and only runs step 3; metrics keep steps 1-2.
    result = RLTrainer(rl_config(assets, run, *common, "trainer.total_training_steps=3")).fit()
    assert result.steps == 3 and len(result.history) == 3
    assert [r["step"] for r in read_metrics(run)] == [1, 2, 3]
    with pytest.raises(UserError, match="written by 1 workers, this run has 2"):
        RLTrainer(rl_config(assets, run, *common, "trainer.total_training_steps=4", "trainer.n_gpus_per_node=2")).fit()
