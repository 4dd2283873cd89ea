"""Clipped value-function loss for the PPO critic (config: ``critic.cliprange_value``).

Notation:
    v[i, t]: new value predictions (vpreds), V[i, t]: values at rollout time (old), R[i, t]: returns
    c: cliprange_value

    v_clip = clamp(v, V - c, V + c)
    l = 0.5 * max((v - R)^2, (v_clip - R)^2)     aggregated by agg_loss
    clipfrac = token mean of [(v_clip - R)^2 > (v - R)^2]

Taking the max (pessimistic) of the clipped and unclipped errors keeps the critic from moving far
from its rollout-time predictions in one update, mirroring the policy's ratio clip.
"""

from __future__ import annotations

import torch

from alignctl.algos.aggregation import Count, agg_loss

__all__ = ["compute_value_loss"]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float | None,
    loss_agg_mode: str = "token-mean",
    *,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
    norm_length: Count | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Clipped critic loss.

    Args:
        vpreds: ``[B, T]`` current critic predictions (carry gradient).
        returns: ``[B, T]`` targets (the estimator's ``returns``).
        values: ``[B, T]`` critic predictions at rollout time.
        mask: ``[B, T]`` response mask.
        cliprange_value: ``c``; ``None`` disables clipping (plain 0.5 * squared error).
        loss_agg_mode, global_num_tokens, global_num_seqs, norm_length: as ``agg_loss``.

    Returns:
        ``(vf_loss, vf_clipfrac)`` scalars; ``vf_clipfrac`` is detached and, like the policy
        diagnostics, normalised by ``global_num_tokens`` when given.
    """
    err = (vpreds - returns).square()
    if cliprange_value is None:
        worst = err
        clipped = torch.zeros_like(err, dtype=torch.bool)
    else:
        v_clip = torch.clamp(vpreds, values - cliprange_value, values + cliprange_value)
        err_clip = (v_clip - returns).square()
        worst = torch.maximum(err, err_clip)
        clipped = err_clip > err
    loss = 0.5 * agg_loss(
        worst,
        mask,
        loss_agg_mode,
        global_num_tokens=global_num_tokens,
        global_num_seqs=global_num_seqs,
        norm_length=norm_length,
    )
    clipfrac = agg_loss(clipped.to(err.dtype), mask, "token-mean", global_num_tokens=global_num_tokens)
    return loss, clipfrac.detach()
