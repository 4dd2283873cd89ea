"""Asynchronous RL with vLLM generating on a rollout pool of its own (CPU build, real Ray workers):
the pool samples one version ahead, every weight load is checked by the probe, and the bound holds.

Runs in .venv-vllm with ``pytest -m vllm``. k = 0 on the pool (the queue, awaited at once) against
the colocated loop is tests/test_vllm_rl.py's pool-placement test.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_helpers import all_finite, make_assets, read_metrics, rl_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ASYNC_POOL = ["actor_rollout_ref.rollout.name=vllm", "trainer.pools.rollout_pool.workers_per_node=1",
              "trainer.placement.rollout=rollout_pool", "trainer.async_rollout.max_staleness=1"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny arith data and a char-level Llama with head_dim 64 (vLLM's CPU kernel refuses 16)."""
    from alignctl.models.tiny import init_model

    root = tmp_path_factory.mktemp("vllm_async")
    assets = make_assets(root, num_train=16, num_test=8)
    model = root / "model128"
    init_model(out=model, tokenizer_from=[assets["data"] / "sft_train.parquet", assets["data"] / "train.parquet"],
               hidden=128, layers=2, heads=2, tokenizer_kind="char", seed=0)
    return {**assets, "model": model}


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
