"""algorithm.rollout_correction: the keys, their checks, and what they switch in the loop (no Ray)."""

from __future__ import annotations

import pytest
import torch

from alignctl.algos import ROLLOUT_CORRECTION_MODES as ALGOS_MODES
from alignctl.batch import Batch
from alignctl.config.core import load_config
from alignctl.config.rl import ROLLOUT_CORRECTION_MODES, RLConfig
from alignctl.errors import UserError
from alignctl.trainers.rl_trainer import ACTOR_UPDATE_INPUTS, is_on_policy
from alignctl.trainers.importance_weights import apply_rollout_correction

BASE = {"actor_rollout_ref.model.path": "m", "data.train_files": ["t.parquet"], "actor_rollout_ref.rollout.n": 2,
        "data.train_batch_size": 4, "actor_rollout_ref.actor.ppo_mini_batch_size": 4}


def rl(*overrides: str) -> RLConfig:
    return load_config(RLConfig, None, list(overrides), flags=BASE)


def test_off_by_default_and_the_config_offers_the_algos_modes() -> None:
    corr = rl().algorithm.rollout_correction
    assert (corr.mode, corr.cap, corr.mask_low, corr.mask_high) == ("none", 2.0, 0.999, 1.001)
    assert ROLLOUT_CORRECTION_MODES == ALGOS_MODES


def test_bad_values_name_the_key() -> None:
    with pytest.raises(UserError, match="algorithm.rollout_correction.mode"):
        rl("algorithm.rollout_correction.mode=tis")
    with pytest.raises(UserError, match="algorithm.rollout_correction.cap"):
        rl("algorithm.rollout_correction.cap=0.5")
    with pytest.raises(UserError, match="algorithm.rollout_correction.mask_high"):
        rl("algorithm.rollout_correction.mask_high=0.9")


def test_a_correction_needs_the_trainers_own_old_log_probs() -> None:
    with pytest.raises(UserError, match=r"'algorithm.rollout_correction.mode' \(seq_is\) needs "
                                        r"actor_rollout_ref.actor.recompute_old_log_prob=true"):
        rl("algorithm.rollout_correction.mode=seq_is", "actor_rollout_ref.actor.recompute_old_log_prob=false")
    rl("actor_rollout_ref.actor.recompute_old_log_prob=false")  # mode none: nothing to check


def test_a_correction_turns_the_on_policy_shortcut_off() -> None:
    """The shortcut skips the old-log-prob pass the weights are computed from."""
    assert is_on_policy(rl())
    assert not is_on_policy(rl("algorithm.rollout_correction.mode=token_tis"))


def _batch(with_engine_log_probs: bool = True) -> Batch:
    cols = {"old_log_probs": torch.tensor([[-1.0, -2.0], [-1.0, -1.0]]),
            "response_mask": torch.tensor([[1, 1], [1, 0]])}
    if with_engine_log_probs:
        cols["rollout_log_probs"] = torch.tensor([[-1.5, -1.0], [-1.0, 0.0]])
    return Batch(cols)


def test_mode_none_leaves_the_batch_alone() -> None:
    batch = _batch()
    out, metrics = apply_rollout_correction(batch, rl().algorithm.rollout_correction)
    assert out is batch and metrics == {}


def test_weights_reach_the_actor_update() -> None:
    corr = rl("algorithm.rollout_correction.mode=token_tis", "algorithm.rollout_correction.cap=1.5").algorithm.rollout_correction
    out, metrics = apply_rollout_correction(_batch(), corr)
    # d = old - behav = [[0.5, -1.0], [0.0, pad]]: min(exp(d), 1.5) = [[1.5, 0.367879], [1, 0]]
    torch.testing.assert_close(out["rollout_is_weights"], torch.tensor([[1.5, 0.367879], [1.0, 0.0]]),
                               atol=1e-6, rtol=0)
    assert "rollout_is_weights" in ACTOR_UPDATE_INPUTS
    # (1.5 + 0.367879 + 1) / 3 valid tokens; exp(0.5) = 1.65 > 1.5 truncated: 1 of 3.
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(0.955960, abs=1e-5)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)


def test_an_engine_without_log_probs_is_named() -> None:
    corr = rl("algorithm.rollout_correction.mode=seq_mask").algorithm.rollout_correction
    with pytest.raises(UserError, match="rollout engine's log-probs"):
        apply_rollout_correction(_batch(with_engine_log_probs=False), corr)
