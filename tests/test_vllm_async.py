"""Asynchronous RL with vLLM generating on a rollout pool of its own (CPU build, real Ray workers):
the pool samples one version ahead, every weight load is checked by the probe, and the bound holds.

Runs in .venv-vllm with ``pytest -m vllm``. k = 0 on the pool (the queue, awaited at once) against
the colocated loop is tests/test_vllm_rl.py's pool-placement test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_helpers import all_finite, make_vllm_assets, read_metrics, rl_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ASYNC_POOL = ["actor_rollout_ref.rollout.name=vllm", "trainer.pools.rollout_pool.workers_per_node=1",
              "trainer.placement.rollout=rollout_pool", "trainer.async_rollout.max_staleness=1"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny arith data and a char-level Llama with head_dim 64 (vLLM's CPU kernel refuses 16)."""
    return make_vllm_assets(tmp_path_factory.mktemp("vllm_async"))


@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_vllm_samples_one_version_ahead_within_the_bound(assets, tmp_path, estimator) -> None:
    """Steps 2 and 3 train batches vLLM sampled with the weights before the previous update
    (staleness 1, never more); each load of new weights passed the probe check; with rollout
    correction on, the trainer's old log-probs differ from vLLM's by the stale update."""
    import ray

    from alignctl.trainers.rl_factory import create_trainer

    run = tmp_path / estimator
    try:
        create_trainer(rl_config(assets, run, *ASYNC_POOL, f"algorithm.adv_estimator={estimator}",
                                 "trainer.total_training_steps=3",
                                 "algorithm.rollout_correction.mode=token_tis")).fit()
    finally:
        ray.shutdown()
    rows = read_metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert [r["rollout/staleness/max"] for r in rows] == [0.0, 1.0, 1.0]
    assert [r["rollout/policy_version"] for r in rows] == [0.0, 0.0, 1.0]
    for row in rows:
        assert all_finite(row)
        assert row["rollout/sync_probe_max_abs_diff"] <= 1e-5  # vLLM generated with the weights it was sent
        assert row["rollout/generated_length/mean"] == row["rollout/trained_length/mean"]
    assert rows[0]["rollout/log_prob_diff_mean"] < rows[1]["rollout/log_prob_diff_mean"]


def _fit(cfg) -> None:
    import ray

    from alignctl.trainers.rl_factory import create_trainer

    try:
        create_trainer(cfg).fit()
    finally:
        ray.shutdown()


def test_multi_turn_tool_rollouts_with_vllm_one_version_ahead(tool_model_64, tmp_path) -> None:
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig

    run = tmp_path / "tools"
    _fit(load_config(RLConfig, None, [
        f"data.train_files=[{tool_model_64['data']}]", f"actor_rollout_ref.model.path={tool_model_64['model']}",
        f"trainer.run_dir={run}", "data.train_batch_size=2", "data.max_prompt_length=1024",
        "data.max_response_length=256", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.optim.lr=1e-4", "trainer.n_gpus_per_node=1",
        "trainer.logger=[jsonl]", "trainer.val_before_train=false", "data.shuffle=false", "monitor.baseline_prompts=0",
        "actor_rollout_ref.rollout.temperature=0.2", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=3",
        "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.multi_turn.max_turns=3",
        "actor_rollout_ref.rollout.multi_turn.valid_call_reward=0.1", *ASYNC_POOL]))
    rows = read_metrics(run)
    assert [r["rollout/staleness/max"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(all_finite(r) and r["multi_turn/calls_per_sample"] > 0 for r in rows)
    # step 1 = prompts 0, 1 (a valid calculator call, a direct answer): the traces are followed
    assert rows[0]["multi_turn/calls/calculator"] == 2 and rows[0]["multi_turn/valid_call_share"] == 1.0


def test_sigkill_mid_queue_resumes_onto_the_queued_batch(assets, tmp_path) -> None:
    """k = 1 with vLLM: killed after step 3's update, resumed from step 2's checkpoint and its queued
    batch (sampled by version 1); metrics (timings aside) and weights equal an uninterrupted run's."""
    import signal

    import torch
    from safetensors.torch import load_file

    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig
    from rl_helpers import launch_kill_driver

    def overrides(run_dir: Path) -> list[str]:
        return [f"data.train_files=[{assets['data'] / 'train.parquet'}]", f"actor_rollout_ref.model.path={assets['model']}",
                f"custom_reward_function.path={assets['reward']}", f"trainer.run_dir={run_dir}",
                "algorithm.adv_estimator=grpo", "data.train_batch_size=4", "data.max_prompt_length=128",
                "data.max_response_length=16", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.optim.lr=1e-3",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_training_steps=4",
                "trainer.save_freq=1", "trainer.n_gpus_per_node=1", "trainer.logger=[jsonl]",
                "trainer.val_before_train=false", "monitor.baseline_prompts=0", *ASYNC_POOL]

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    _fit(load_config(RLConfig, None, overrides(whole)))
    run = launch_kill_driver("mid_step:3", overrides(killed), timeout=600)
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    final = launch_kill_driver("none", overrides(killed), timeout=600)
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-4000:]
    assert "resuming from" in final.stdout

    def deterministic(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith(("timing_s/", "perf/"))} for r in rows]

    rows = read_metrics(killed)
    assert [r["rollout/staleness/max"] for r in rows] == [0.0, 1.0, 1.0, 1.0]
    assert deterministic(rows) == deterministic(read_metrics(whole))
    a, b = (load_file(str(p / "actor" / "model.safetensors")) for p in (whole, killed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
