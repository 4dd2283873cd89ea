"""Rollout correction in the real loop (CPU, hf engine in float32, so the engine-trainer gap is ~1e-7)."""

from __future__ import annotations

import pytest

from alignctl.trainers.rl_trainer import RLTrainer
from rl_helpers import all_finite, make_assets, read_metrics, rl_config, ray_session  # noqa: F401 - module fixture

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("rc"))


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


def test_multi_turn_weights_line_up_with_the_sampled_tokens(tool_model, tmp_path):
    """A multi-turn response interleaves sampled tokens with tool output the engine gave no
    log-prob for: the weights are taken over the loss mask only, so the engine-trainer gap stays
    rounding-sized and no weight is truncated (the fitted model is confident, but not certain:
    its perplexity is above 1)."""
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig

    cfg = load_config(RLConfig, None, [
        f"data.train_files=[{tool_model['data']}]", f"actor_rollout_ref.model.path={tool_model['model']}",
        f"trainer.run_dir={tmp_path / 'run'}", "data.train_batch_size=2", "data.max_prompt_length=1024",
        "data.max_response_length=256", "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.rollout.n=2",
        "trainer.n_gpus_per_node=1", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        "trainer.total_training_steps=1", "actor_rollout_ref.rollout.temperature=1.0",
        "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.multi_turn.max_turns=3",
        "data.shuffle=false", "actor_rollout_ref.rollout.multi_turn.valid_call_reward=0.1",
        "actor_rollout_ref.rollout.multi_turn.tool_error_penalty=0.2", "algorithm.rollout_correction.mode=token_tis"])
    RLTrainer(cfg).fit()
    row = read_metrics(tmp_path / "run")[0]
    assert row["multi_turn/calls_per_sample"] > 0 and all_finite(row) and row["rollout_corr/training_ppl"] > 1.0
    assert row["rollout_corr/rollout_is_ratio_fraction_high"] == 0.0
    assert abs(row["rollout_corr/kl"]) < 1e-4 and row["rollout_corr/rollout_is_mean"] == pytest.approx(1.0, abs=1e-3)


def test_a_rejected_response_contributes_nothing_to_the_actor_update(assets, tmp_path):
    """The actor's loss with weight 0 on some responses equals the loss with those responses'
    advantages set to 0, exactly (loss and gradient), and the rest still trains."""
    import torch

    from alignctl.batch import Batch
    from test_rl_loop import _prompt_batch, _update_group

    results = []
    for weighted in (False, True):
        group = _update_group(assets, tmp_path / str(weighted), world=1, micro=8)
        try:
            batch = group.split("actor", "generate_sequences", _prompt_batch(group, assets))
            batch = batch.union(group.split("actor", "compute_log_prob", batch).select(["old_log_probs"]))
            advantages = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0))
            keep = torch.tensor([0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]).unsqueeze(-1) * batch["response_mask"]
            columns = ({"advantages": advantages, "rollout_is_weights": keep} if weighted
                       else {"advantages": advantages * keep})
            results.append(group.split_collect("actor", "update_actor", batch.union(Batch(columns)))[0])
        finally:
            group.shutdown()
    assert results[0]["actor/grad_norm"] > 0
    for key in ("actor/pg_loss", "actor/grad_norm"):
        assert results[1][key] == results[0][key], key
