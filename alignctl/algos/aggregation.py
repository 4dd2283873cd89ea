"""Reduce a token-level loss matrix to a scalar (config: ``actor_rollout_ref.actor.loss_agg_mode``).

Notation:
    B: sequences in this part of the batch (a micro-batch on one rank)
    T: padded response length
    m[i, t]: loss mask (1 = token contributes), l[i, t]: per-token loss
    n_i = sum_t m[i, t]: valid tokens of sequence i
    N_tok: valid tokens of the WHOLE batch (all ranks, all micro-batches)
    N_seq: sequences of the whole batch with n_i > 0
    L: constant length normaliser (Dr.GRPO), ``norm_length``

Modes:
    token-mean               sum_{i,t} m l / N_tok
    seq-mean-token-sum       sum_i (sum_t m l) / N_seq
    seq-mean-token-mean      sum_i (sum_t m l / n_i) / N_seq
    seq-mean-token-sum-norm  sum_i (sum_t m l) / (N_seq * L)

Split invariance: every mode is a sum over sequences divided by a batch-wide constant. When the
caller passes the whole batch's ``global_num_tokens`` / ``global_num_seqs`` (summed over ranks and
micro-batches, see ``count_loss_tokens`` / ``count_loss_seqs``), the losses of the parts SUM to the
loss of the whole batch, so gradient accumulation reproduces the full-batch gradient exactly. (A
data-parallel wrapper that AVERAGES gradients over W ranks needs the caller to multiply by W.)
Without global counts each call normalises by its own counts: the right answer for a single call
on the whole batch.

Sequences with no valid token contribute 0 and are not counted in ``N_seq`` (their token mean is
undefined); an all-empty mask gives loss 0, never NaN.
"""

from __future__ import annotations

import torch

from alignctl.algos.masked import masked_count, masked_sum, safe_div

__all__ = ["LOSS_AGG_MODES", "agg_loss", "count_loss_tokens", "count_loss_seqs"]

LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)

Count = int | float | torch.Tensor


def count_loss_tokens(mask: torch.Tensor) -> torch.Tensor:
    """``N_tok`` of this part: valid tokens. Sum it over parts to get ``global_num_tokens``."""
    return mask.bool().sum()


def count_loss_seqs(mask: torch.Tensor) -> torch.Tensor:
    """``N_seq`` of this part: sequences with at least one valid token (``mask [B, T]``)."""
    return mask.bool().any(dim=-1).sum()


def agg_loss(
    loss_mat: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    *,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
    norm_length: Count | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat [B, T]`` under ``mask [B, T]`` into a scalar, per ``mode``.

    Args:
        loss_mat: per-token losses ``[B, T]``; values at masked positions are ignored.
        mask: ``[B, T]`` 0/1 loss mask.
        mode: one of ``LOSS_AGG_MODES``.
        global_num_tokens: ``N_tok`` of the whole batch (token-mean); default: this part's count.
        global_num_seqs: ``N_seq`` of the whole batch (seq-* modes); default: this part's count.
        norm_length: ``L`` for seq-mean-token-sum-norm; default ``T``. Pass a constant (the max
            response length) when parts may be padded to different ``T``.

    Returns:
        scalar tensor.
    """
    if mode == "token-mean":
        n_tok = count_loss_tokens(mask) if global_num_tokens is None else global_num_tokens
        return safe_div(masked_sum(loss_mat, mask), n_tok)
    if mode not in LOSS_AGG_MODES:
        raise ValueError(f"unknown loss_agg_mode {mode!r}; valid modes: {', '.join(LOSS_AGG_MODES)}")

    seq_sums = masked_sum(loss_mat, mask, dim=-1)  # [B]
    if mode == "seq-mean-token-mean":
        seq_sums = safe_div(seq_sums, masked_count(mask, loss_mat, dim=-1))
    n_seq = count_loss_seqs(mask) if global_num_seqs is None else global_num_seqs
    loss = safe_div(seq_sums.sum(), n_seq)
    if mode == "seq-mean-token-sum-norm":
        loss = loss / (loss_mat.shape[-1] if norm_length is None else norm_length)
    return loss
