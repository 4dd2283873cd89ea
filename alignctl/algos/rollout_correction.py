"""Rollout correction: importance weights for the gap between the rollout engine and the trainer.

The engine that sampled a response (vLLM in bf16, a stale copy of the weights) gives its tokens
slightly different probabilities than the trainer's own forward pass. PPO's ratio is taken
against the trainer's old log-probs, so the samples are, strictly, off-policy by the gap
``pi_old / pi_rollout``. These functions measure that gap and turn it into loss weights.

Notation:
    B: responses, T: padded response length, m[i, t]: response mask (0/1)
    old[i, t]: the trainer's old log-probs, behav[i, t]: the rollout engine's (behaviour) log-probs
    d = old - behav: per-token log importance ratio log(pi_old / pi_rollout)

Modes (``ROLLOUT_CORRECTION_MODES``), each a weight ``w[i, t]`` on the per-token policy loss:
    none       w = m (no correction)
    token_tis  w = min(exp(d), C) per token (truncated IS)
    seq_is     w_i = min(exp(sum_t d), C) for every token of sequence i (clamped in log space)
    seq_mask   w_i = 1 if low <= exp(mean_t d) <= high else 0 (rejects whole sequences whose
               geometric-mean ratio is outside the bounds; no reweighting)

Weights are 0 at padding and carry no gradient. Metric names follow verl's ``rollout_corr/*``
(the caller adds the prefix); every value is a detached scalar tensor.
"""

from __future__ import annotations

import math

import torch

from alignctl.algos.masked import masked_mean

__all__ = [
    "ROLLOUT_CORRECTION_MODES",
    "rollout_correction_weights",
    "rollout_mismatch",
]

ROLLOUT_CORRECTION_MODES = ("none", "token_tis", "seq_is", "seq_mask")

# exp(20) ~ 5e8: a wild log-ratio cannot overflow exp (the cap then clips it anyway).
LOG_RATIO_BOUND = 20.0


def _valid_rows(mask: torch.Tensor) -> torch.Tensor:
    """``[B]`` bool: sequences with at least one response token (the others join no sequence mean)."""
    return mask.sum(-1) > 0


def _row_mean(values: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """Mean of ``values [B]`` over the ``rows [B]`` that are True (0 when none is)."""
    return masked_mean(values, rows.to(values.dtype))


def rollout_correction_weights(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    mode: str,
    *,
    cap: float = 2.0,
    low: float = 0.999,
    high: float = 1.001,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Loss weights ``[B, T]`` (0 at padding, detached) for ``mode``, and their diagnostics.

    Args:
        old_log_prob, rollout_log_prob, response_mask: ``[B, T]``.
        mode: one of ``ROLLOUT_CORRECTION_MODES``.
        cap: ``C`` for token_tis and seq_is.
        low, high: the geometric-mean ratio bounds of seq_mask.

    Diagnostics (verl's names): token_tis / seq_is give ``rollout_is_mean`` (mean weight over valid
    tokens / sequences), ``rollout_is_max`` and ``rollout_is_ratio_fraction_high`` (share of valid
    tokens / sequences whose ratio exceeded C and was truncated); seq_mask gives
    ``rollout_rs_masked_fraction`` (share of valid tokens rejected) and
    ``rollout_rs_seq_masked_fraction`` (share of sequences rejected).
    """
    if mode not in ROLLOUT_CORRECTION_MODES:
        raise ValueError(f"unknown rollout correction mode {mode!r}; valid: {', '.join(ROLLOUT_CORRECTION_MODES)}")
    mask = response_mask.to(old_log_prob.dtype)
    d = ((old_log_prob - rollout_log_prob) * mask).detach()
    rows = _valid_rows(mask)
    if mode == "none":
        return mask, {}
    if mode == "token_tis":
        log_ratio = torch.clamp(d, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
        weights = torch.clamp(torch.exp(log_ratio), max=cap) * mask
        return weights, {
            "rollout_is_mean": masked_mean(weights, mask),
            "rollout_is_max": weights.max(),
            "rollout_is_ratio_fraction_high": masked_mean((log_ratio > math.log(cap)).to(d.dtype), mask),
        }
    if mode == "seq_is":
        seq_log_ratio = torch.clamp(d.sum(-1), -LOG_RATIO_BOUND, LOG_RATIO_BOUND)  # [B]
        seq_weights = torch.clamp(torch.exp(seq_log_ratio), max=cap)
        truncated = (seq_log_ratio > math.log(cap)).to(d.dtype)
        return seq_weights.unsqueeze(-1) * mask, {
            "rollout_is_mean": _row_mean(seq_weights, rows),
            "rollout_is_max": torch.where(rows, seq_weights, torch.zeros_like(seq_weights)).max(),
            "rollout_is_ratio_fraction_high": _row_mean(truncated, rows),
        }
    geo_mean = torch.exp(masked_mean(d, mask, dim=-1))  # [B]; 1 for an empty row
    keep = ((geo_mean >= low) & (geo_mean <= high)).to(d.dtype)
    weights = keep.unsqueeze(-1) * mask
    return weights, {
        "rollout_rs_masked_fraction": 1.0 - masked_mean(weights, mask),
        "rollout_rs_seq_masked_fraction": _row_mean(1.0 - keep, rows),
    }


def rollout_mismatch(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, torch.Tensor]:
    """How far the engine's log-probs are from the trainer's, all ``[B, T]`` in, scalars out.

    With ``d = old - behav`` over valid tokens (verl's names):
        kl             mean(-d): k1 estimate of KL(pi_rollout || pi_old) (samples come from the engine)
        k3_kl          mean(exp(d) - d - 1): the non-negative, lower-variance k3 estimate of the same
        chi2_token     mean(exp(d)^2) - 1: chi-square divergence of the token ratio (IS variance)
        chi2_seq       mean_i(exp(sum_t d)^2) - 1 over sequences
        training_ppl   mean_i exp(-mean_t old), rollout_ppl: the same of behav
        log_ppl_diff   mean_i(mean_t behav - mean_t old) = mean_i log(training_ppl_i / rollout_ppl_i)
        ppl_ratio      mean_i(training_ppl_i / rollout_ppl_i), per sequence, then averaged
    Exponents are clamped to +-20 (chi-square: before squaring).
    """
    mask = response_mask.to(old_log_prob.dtype)
    old, behav = old_log_prob.detach(), rollout_log_prob.detach()
    d = (old - behav) * mask
    rows = _valid_rows(mask)
    bounded = torch.clamp(d, -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    seq_bounded = torch.clamp(d.sum(-1), -LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    mean_old = masked_mean(old, mask, dim=-1)  # [B]
    mean_behav = masked_mean(behav, mask, dim=-1)
    log_ppl_diff = mean_behav - mean_old
    return {
        "kl": masked_mean(-d, mask),
        "k3_kl": masked_mean(torch.exp(bounded) - bounded - 1.0, mask),
        "chi2_token": masked_mean(torch.exp(2.0 * bounded), mask) - 1.0,
        "chi2_seq": _row_mean(torch.exp(2.0 * seq_bounded), rows) - 1.0,
        "training_ppl": _row_mean(torch.exp(-mean_old), rows),
        "rollout_ppl": _row_mean(torch.exp(-mean_behav), rows),
        "log_ppl_diff": _row_mean(log_ppl_diff, rows),
        "ppl_ratio": _row_mean(torch.exp(log_ppl_diff), rows),
    }

