"""Masked reductions and agg_loss: hand-computed goldens, empty masks, split invariance.

Split invariance is the contract the trainers rely on: a batch split over 2 simulated ranks x 3
micro-batches, each part aggregated with the whole batch's global counts, must SUM to the
whole-batch loss (and gradient), for every aggregation mode and every policy loss.
"""

from __future__ import annotations

import math

import pytest
import torch

from alignctl.algos import (
    LOSS_AGG_MODES,
    POLICY_LOSSES,
    agg_loss,
    count_loss_seqs,
    count_loss_tokens,
    get_policy_loss,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)

TOL = dict(rtol=0.0, atol=1e-6)
F64 = torch.float64


def t(x: object) -> torch.Tensor:
    return torch.tensor(x, dtype=F64)


# ----------------------------------------------------------------------------- masked ops

VALUES = t([[1.0, 2.0, 3.0], [4.0, 100.0, -50.0]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]])  # valid values: 1, 2, 4


def test_masked_sum_mean_var_golden() -> None:
    assert masked_sum(VALUES, MASK).item() == 7.0
    torch.testing.assert_close(masked_mean(VALUES, MASK), t(7 / 3), **TOL)
    torch.testing.assert_close(masked_mean(VALUES, MASK, dim=-1), t([1.5, 4.0]), **TOL)
    # deviations from 7/3: -4/3, -1/3, 5/3 -> squares sum 16/9 + 1/9 + 25/9 = 42/9
    torch.testing.assert_close(masked_var(VALUES, MASK, unbiased=False), t(42 / 9 / 3), **TOL)
    torch.testing.assert_close(masked_var(VALUES, MASK, unbiased=True), t(42 / 9 / 2), **TOL)


def test_masked_whiten_golden() -> None:
    out = masked_whiten(VALUES, MASK)
    scale = 1 / math.sqrt(42 / 9 / 2 + 1e-8)  # unbiased variance, eps 1e-8
    expected = t([[(1 - 7 / 3) * scale, (2 - 7 / 3) * scale, 0.0], [(4 - 7 / 3) * scale, 0.0, 0.0]])
    torch.testing.assert_close(out, expected, **TOL)
    unshifted = masked_whiten(VALUES, MASK, shift_mean=False)
    torch.testing.assert_close(unshifted, torch.where(MASK.bool(), expected + 7 / 3, 0.0), **TOL)


def test_masked_ops_ignore_nan_and_inf_at_masked_positions() -> None:
    junk = VALUES.clone()
    junk[0, 2], junk[1, 1], junk[1, 2] = float("nan"), float("inf"), -float("inf")
    for fn in (masked_sum, masked_mean, masked_var, masked_whiten):
        assert torch.equal(fn(junk, MASK), fn(VALUES, MASK)), fn.__name__


def test_masked_ops_empty_mask_and_single_element_are_zero_not_nan() -> None:
    empty = torch.zeros_like(MASK)
    assert masked_mean(VALUES, empty).item() == 0.0
    assert masked_var(VALUES, empty).item() == 0.0
    assert torch.equal(masked_whiten(VALUES, empty), torch.zeros_like(VALUES))
    one = torch.tensor([[1, 0, 0], [0, 0, 0]])
    assert masked_var(VALUES, one, unbiased=True).item() == 0.0  # n - 1 = 0: defined as 0
    assert torch.equal(masked_mean(VALUES, empty, dim=-1), t([0.0, 0.0]))


def test_masked_mean_gradient_is_finite_on_empty_mask() -> None:
    x = VALUES.clone().requires_grad_()
    masked_mean(x, torch.zeros_like(MASK)).backward()
    assert torch.equal(x.grad, torch.zeros_like(VALUES))


# ----------------------------------------------------------------------------- agg_loss goldens

LOSS = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
LOSS_MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])  # row 2 is empty


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", 7 / 3),  # (1 + 2 + 4) / 3 tokens
        ("seq-mean-token-sum", 7 / 2),  # (3 + 4) / 2 non-empty sequences
        ("seq-mean-token-mean", (3 / 2 + 4 / 1) / 2),  # = 2.75
        ("seq-mean-token-sum-norm", 7 / (2 * 3)),  # (3 + 4) / (2 sequences * L = T = 3)
    ],
)
def test_agg_loss_golden(mode: str, expected: float) -> None:
    torch.testing.assert_close(agg_loss(LOSS, LOSS_MASK, mode), t(expected), **TOL)


def test_agg_loss_explicit_counts_and_norm_length() -> None:
    torch.testing.assert_close(agg_loss(LOSS, LOSS_MASK, "token-mean", global_num_tokens=14), t(7 / 14), **TOL)
    torch.testing.assert_close(agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum", global_num_seqs=7), t(1.0), **TOL)
    torch.testing.assert_close(
        agg_loss(LOSS, LOSS_MASK, "seq-mean-token-sum-norm", norm_length=10), t(7 / (2 * 10)), **TOL
    )
    assert count_loss_tokens(LOSS_MASK).item() == 3
    assert count_loss_seqs(LOSS_MASK).item() == 2


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_empty_mask_is_zero_and_masked_junk_is_ignored(mode: str) -> None:
    assert agg_loss(LOSS, torch.zeros_like(LOSS_MASK), mode).item() == 0.0
    junk = torch.where(LOSS_MASK.bool(), LOSS, t(1e30))
    assert torch.equal(agg_loss(junk, LOSS_MASK, mode), agg_loss(LOSS, LOSS_MASK, mode))


def test_agg_loss_unknown_mode_lists_valid_modes() -> None:
    with pytest.raises(ValueError, match="seq-mean-token-mean"):
        agg_loss(LOSS, LOSS_MASK, "token-sum")


# ----------------------------------------------------------------------------- split invariance

B, T = 12, 7
# 2 ranks (7 and 5 rows, deliberately uneven) x 3 micro-batches each.
PARTS = [(0, 3), (3, 5), (5, 7), (7, 9), (9, 11), (11, 12)]


def _batch() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(1234)
    lengths = torch.tensor([7, 3, 0, 5, 1, 7, 2, 6, 4, 0, 7, 3])  # two empty responses
    mask = (torch.arange(T).unsqueeze(0) < lengths.unsqueeze(1)).to(F64)
    mask[5, 2] = 0.0  # a masked observation token inside a response (multi-turn)
    old = -torch.rand(B, T, generator=g, dtype=F64) * 3
    new = old + torch.randn(B, T, generator=g, dtype=F64) * 0.3
    adv = torch.randn(B, T, generator=g, dtype=F64)
    return {"mask": mask, "old": old, "new": new, "adv": adv, "loss": torch.randn(B, T, generator=g, dtype=F64)}


def _global_counts(mask: torch.Tensor) -> dict[str, torch.Tensor]:
    # What the trainer does: count per part, then sum (an all-reduce over ranks in real runs).
    return {
        "global_num_tokens": sum(count_loss_tokens(mask[a:b]) for a, b in PARTS),
        "global_num_seqs": sum(count_loss_seqs(mask[a:b]) for a, b in PARTS),
    }


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
def test_agg_loss_parts_sum_to_whole_batch(mode: str) -> None:
    batch = _batch()
    mask, loss_mat = batch["mask"], batch["loss"]
    counts = _global_counts(mask)
    whole = agg_loss(loss_mat, mask, mode)
    parts = sum(agg_loss(loss_mat[a:b], mask[a:b], mode, norm_length=T, **counts) for a, b in PARTS)
    torch.testing.assert_close(parts, whole, **TOL)


@pytest.mark.parametrize("mode", LOSS_AGG_MODES)
@pytest.mark.parametrize("name", list(POLICY_LOSSES))
def test_policy_loss_parts_sum_to_whole_batch(name: str, mode: str) -> None:
    batch = _batch()
    fn = get_policy_loss(name)
    kwargs = dict(loss_agg_mode=mode, clip_ratio=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    counts = _global_counts(batch["mask"])

    new_whole = batch["new"].clone().requires_grad_()
    whole, whole_diag = fn(batch["old"], new_whole, batch["adv"], batch["mask"], **kwargs)
    whole.backward()

    new_parts = batch["new"].clone().requires_grad_()
    total = torch.zeros((), dtype=F64)
    diag_sum = {key: torch.zeros((), dtype=F64) for key in whole_diag}
    for a, b in PARTS:
        loss, diag = fn(
            batch["old"][a:b], new_parts[a:b], batch["adv"][a:b], batch["mask"][a:b], norm_length=T, **counts, **kwargs
        )
        total = total + loss
        diag_sum = {key: diag_sum[key] + diag[key] for key in diag}
    total.backward()

    torch.testing.assert_close(total, whole, **TOL)
    torch.testing.assert_close(new_parts.grad, new_whole.grad, **TOL)
    for key, value in whole_diag.items():
        torch.testing.assert_close(diag_sum[key], value, **TOL)
