"""Rollout correction weights and mismatch metrics against numbers worked out by hand.

The shared example (two responses, the second one token shorter):

    old   = [[-1.0, -2.0, -0.5], [-1.0, -1.0, pad]]
    behav = [[-1.5, -1.0, -0.5], [-1.0, -3.0, pad]]
    d = old - behav = [[0.5, -1.0, 0.0], [0.0, 2.0]]   (5 valid tokens)
    exp(d)          = [[1.648721, 0.367879, 1.0], [1.0, 7.389056]]
    per-sequence sum of d: -0.5 and 2.0; mean of d: -1/6 and 1.0
"""

from __future__ import annotations

import math

import pytest
import torch

from alignctl.algos import (
    POLICY_LOSSES,
    ROLLOUT_CORRECTION_MODES,
    get_policy_loss,
    rollout_correction_weights,
    rollout_mismatch,
)

OLD = torch.tensor([[-1.0, -2.0, -0.5], [-1.0, -1.0, -9.0]])
BEHAV = torch.tensor([[-1.5, -1.0, -0.5], [-1.0, -3.0, 4.0]])  # the pad values are garbage on purpose
MASK = torch.tensor([[1, 1, 1], [1, 1, 0]])


def _close(metrics: dict[str, torch.Tensor], expected: dict[str, float]) -> None:
    assert set(metrics) == set(expected)
    for name, value in expected.items():
        assert float(metrics[name]) == pytest.approx(value, abs=1e-5), name


def test_modes_are_the_documented_four() -> None:
    assert ROLLOUT_CORRECTION_MODES == ("none", "token_tis", "seq_is", "seq_mask")


def test_none_is_the_mask_and_reports_nothing() -> None:
    weights, metrics = rollout_correction_weights(OLD, BEHAV, MASK, "none")
    assert torch.equal(weights, MASK.float()) and metrics == {}


def test_token_tis_truncates_each_token_at_the_cap() -> None:
    weights, metrics = rollout_correction_weights(OLD, BEHAV, MASK, "token_tis", cap=2.0)
    # min(exp(d), 2): 7.389 -> 2; padding -> 0.
    expected = torch.tensor([[1.648721, 0.367879, 1.0], [1.0, 2.0, 0.0]])
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)
    # mean (1.648721 + 0.367879 + 1 + 1 + 2) / 5 = 1.203320; one token of five truncated.
    _close(metrics, {"rollout_is_mean": 1.203320, "rollout_is_max": 2.0, "rollout_is_ratio_fraction_high": 0.2})


def test_seq_is_weights_whole_sequences_by_the_product_of_ratios() -> None:
    weights, metrics = rollout_correction_weights(OLD, BEHAV, MASK, "seq_is", cap=2.0)
    # row 0: exp(-0.5) = 0.606531; row 1: exp(2.0) = 7.389 -> capped at 2.
    expected = torch.tensor([[0.606531] * 3, [2.0, 2.0, 0.0]])
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=0)
    # sequence mean (0.606531 + 2) / 2 = 1.303265; one sequence of two truncated.
    _close(metrics, {"rollout_is_mean": 1.303265, "rollout_is_max": 2.0, "rollout_is_ratio_fraction_high": 0.5})


def test_seq_is_does_not_overflow_on_a_long_divergent_sequence() -> None:
    old = torch.zeros(1, 200)
    behav = torch.full((1, 200), -1.0)  # sum of d = 200: exp would overflow float32
    weights, _ = rollout_correction_weights(old, behav, torch.ones(1, 200), "seq_is", cap=3.0)
    assert torch.equal(weights, torch.full((1, 200), 3.0))


def test_seq_mask_rejects_sequences_whose_geometric_mean_ratio_leaves_the_bounds() -> None:
    weights, metrics = rollout_correction_weights(OLD, BEHAV, MASK, "seq_mask", low=0.5, high=1.5)
    # row 0: exp(-1/6) = 0.846482 inside [0.5, 1.5] -> kept; row 1: exp(1) = 2.718 > 1.5 -> rejected.
    assert torch.equal(weights, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    # 2 of 5 tokens and 1 of 2 sequences rejected.
    _close(metrics, {"rollout_rs_masked_fraction": 0.4, "rollout_rs_seq_masked_fraction": 0.5})


def test_seq_mask_lower_bound() -> None:
    weights, _ = rollout_correction_weights(OLD, BEHAV, MASK, "seq_mask", low=0.9, high=3.0)
    # row 0's 0.846482 < 0.9 -> rejected; row 1's 2.718 inside [0.9, 3] -> kept.
    assert torch.equal(weights, torch.tensor([[0.0, 0.0, 0.0], [1.0, 1.0, 0.0]]))


def test_mismatch_metrics_by_hand() -> None:
    metrics = rollout_mismatch(OLD, BEHAV, MASK)
    _close(metrics, {
        # mean(-d) = -(0.5 - 1 + 0 + 0 + 2) / 5
        "kl": -0.3,
        # exp(d) - d - 1: 0.148721, 0.367879, 0, 0, 4.389056 -> sum 4.905656 / 5
        "k3_kl": 0.981131,
        # exp(2d): 2.718282, 0.135335, 1, 1, 54.598150 -> 59.451767 / 5 - 1
        "chi2_token": 10.890353,
        # exp(2 * -0.5) = 0.367879, exp(2 * 2) = 54.598150 -> mean 27.483015 - 1
        "chi2_seq": 26.483015,
        # mean old per row: -7/6, -1 -> exp(7/6) = 3.211271, e = 2.718282
        "training_ppl": (3.211271 + 2.718282) / 2,
        # mean behav per row: -1, -2 -> e = 2.718282, e^2 = 7.389056
        "rollout_ppl": (2.718282 + 7.389056) / 2,
        # mean behav - mean old per row: 1/6, -1
        "log_ppl_diff": (1 / 6 - 1.0) / 2,
        # exp(1/6) = 1.181360 (= 3.211271 / 2.718282), exp(-1) = 0.367879
        "ppl_ratio": (1.181360 + 0.367879) / 2,
    })


def test_a_response_without_tokens_changes_no_metric() -> None:
    old = torch.cat([OLD, torch.tensor([[5.0, 5.0, 5.0]])])
    behav = torch.cat([BEHAV, torch.tensor([[-7.0, -7.0, -7.0]])])
    mask = torch.cat([MASK, torch.zeros(1, 3, dtype=MASK.dtype)])
    for mode in ROLLOUT_CORRECTION_MODES:
        weights, metrics = rollout_correction_weights(old, behav, mask, mode, cap=2.0, low=0.5, high=1.5)
        ref_weights, ref_metrics = rollout_correction_weights(OLD, BEHAV, MASK, mode, cap=2.0, low=0.5, high=1.5)
        assert torch.equal(weights[:2], ref_weights) and not weights[2].any()
        _close(metrics, {k: float(v) for k, v in ref_metrics.items()})
    _close(rollout_mismatch(old, behav, mask), {k: float(v) for k, v in rollout_mismatch(OLD, BEHAV, MASK).items()})


def test_identical_policies_give_unit_weights_and_zero_mismatch() -> None:
    for mode in ("token_tis", "seq_is", "seq_mask"):
        weights, _ = rollout_correction_weights(OLD, OLD, MASK, mode)
        assert torch.equal(weights, MASK.float())
    metrics = rollout_mismatch(OLD, OLD, MASK)
    for name in ("kl", "k3_kl", "chi2_token", "chi2_seq", "log_ppl_diff"):
        assert float(metrics[name]) == 0.0, name
    assert float(metrics["ppl_ratio"]) == pytest.approx(1.0)


def test_weights_carry_no_gradient() -> None:
    old = OLD.clone().requires_grad_()
    weights, _ = rollout_correction_weights(old, BEHAV, MASK, "token_tis")
    assert not weights.requires_grad


def test_unknown_mode_names_the_valid_ones() -> None:
    with pytest.raises(ValueError, match="token_tis"):
        rollout_correction_weights(OLD, BEHAV, MASK, "tis")


@pytest.mark.parametrize("loss_mode", sorted(POLICY_LOSSES))
def test_weighting_the_advantages_weights_each_tokens_loss(loss_mode: str) -> None:
    """The trainer applies the weights as ``advantages * w``: for every built-in loss (each is
    positively homogeneous in the advantage) that equals ``w_t * l_t`` token by token. Checked
    by isolating each token with a one-token mask (token-mean over a fixed global count)."""
    torch.manual_seed(0)
    old = -torch.rand(2, 4) * 2
    logp = old + torch.randn(2, 4) * 0.3
    adv = torch.randn(2, 4)
    weights = torch.tensor([[0.0, 0.5, 1.0, 2.0], [1.5, 0.0, 0.25, 1.0]])
    loss_fn = get_policy_loss(loss_mode)
    for i in range(2):
        for t in range(4):
            one = torch.zeros(2, 4)
            one[i, t] = 1.0
            kw = {"loss_agg_mode": "token-mean", "global_num_tokens": 8}
            weighted, _ = loss_fn(old, logp, adv * weights, one, **kw)
            plain, _ = loss_fn(old, logp, adv, one, **kw)
            assert float(weighted) == pytest.approx(float(weights[i, t] * plain), abs=1e-6), (i, t)
    assert math.isfinite(float(plain))
