"""Rollout correction in the real loop (CPU, hf engine in float32, so the engine-trainer gap is ~1e-7)."""

from __future__ import annotations

import pytest

from alignctl.trainers.rl_trainer import RLTrainer
from alignctl.workers.ray_session import init_ray
from rl_helpers import all_finite, make_assets, read_metrics, rl_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("rc"))


@pytest.fixture(scope="module", autouse=True)
def ray_session():
    import ray

    init_ray(None, num_cpus=4)
    yield
    ray.shutdown()


def test_token_tis_on_a_float32_engine_changes_the_first_update_only_by_rounding(assets, tmp_path):
    """Same seed, same first batch: with weights ~1 the first step's loss equals the uncorrected one's;
    the weights' and the mismatch metrics are logged every step."""
    rows = {}
    for mode in ("none", "token_tis"):
        RLTrainer(rl_config(assets, tmp_path / mode, f"algorithm.rollout_correction.mode={mode}")).fit()
        rows[mode] = read_metrics(tmp_path / mode)
    corrected = rows["token_tis"]
    assert [r["step"] for r in corrected] == [1, 2] and all(all_finite(r) for r in corrected)
    assert corrected[0]["actor/pg_loss"] == pytest.approx(rows["none"][0]["actor/pg_loss"], rel=1e-4, abs=1e-6)
    for row in corrected:
        assert row["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-4)
        assert row["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
        assert abs(row["rollout_corr/kl"]) < 1e-5 and row["rollout_corr/ppl_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert "rollout_corr/kl" not in rows["none"][0]  # on-policy without a correction: no old-log-prob pass


def test_seq_mask_keeps_every_response_when_the_gap_is_rounding(assets, tmp_path):
    RLTrainer(rl_config(assets, tmp_path / "run", "algorithm.rollout_correction.mode=seq_mask",
                        "actor_rollout_ref.actor.ppo_mini_batch_size=2")).fit()
    rows = read_metrics(tmp_path / "run")
    assert all(all_finite(r) for r in rows) and rows[0]["actor/grad_norm"] > 0
    assert all(r["rollout_corr/rollout_rs_seq_masked_fraction"] == 0.0 for r in rows)
