"""Policy-gradient losses (config: ``actor_rollout_ref.actor.policy_loss.loss_mode``).

Notation:
    B: responses, T: padded response length, m[i, t]: response mask
    logp = log pi_theta(y_t | ...), old = log pi_old(y_t | ...) (the policy that sampled / the
        start of this PPO epoch), A[i, t]: advantages
    rho = exp(clamp(logp - old, -20, 20)): token importance ratio (clamped in log space, as verl,
        so a wild log-prob cannot overflow exp)
    eps_lo, eps_hi: clip_ratio_low / clip_ratio_high (each defaults to clip_ratio), c: clip_ratio_c

Every loss is ``fn(old_log_prob [B, T], log_prob [B, T], advantages [B, T], response_mask [B, T], *,
loss_agg_mode, global_num_tokens=None, global_num_seqs=None, norm_length=None, clip_ratio=0.2,
clip_ratio_low=None, clip_ratio_high=None, clip_ratio_c=3.0) -> (loss, diagnostics)``.
``loss`` is aggregated by ``agg_loss`` (see aggregation.py for the split-invariance contract).
``diagnostics`` holds scalar tensors, detached:

    pg_clipfrac        fraction of valid tokens whose loss took the clipped branch
    pg_clipfrac_lower  fraction of valid tokens hit by the lower / dual clip (0 where not defined)
    ppo_kl             mean of (old - logp), the k1 estimate of KL(pi_old || pi_theta)

Diagnostics are token means normalised like ``token-mean`` (by ``global_num_tokens`` when
given), so over the parts of a split batch they SUM to the whole batch's value, like the loss.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import torch

from alignctl.algos.aggregation import Count, agg_loss
from alignctl.algos.masked import masked_mean
from alignctl.registries import Registry

__all__ = [
    "POLICY_LOSSES",
    "PolicyLoss",
    "register_policy_loss",
    "get_policy_loss",
]

LOG_RATIO_CLAMP = 20.0


class PolicyLoss(Protocol):
    """The one signature every registered policy loss has."""

    def __call__(
        self,
        old_log_prob: torch.Tensor,
        log_prob: torch.Tensor,
        advantages: torch.Tensor,
        response_mask: torch.Tensor,
        *,
        loss_agg_mode: str,
        global_num_tokens: Count | None = None,
        global_num_seqs: Count | None = None,
        norm_length: Count | None = None,
        clip_ratio: float = 0.2,
        clip_ratio_low: float | None = None,
        clip_ratio_high: float | None = None,
        clip_ratio_c: float = 3.0,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...


POLICY_LOSSES: Registry[PolicyLoss] = Registry("policy loss")


def register_policy_loss(name: str) -> Callable[[PolicyLoss], PolicyLoss]:
    """Decorator registering a loss under ``name`` (the ``policy_loss.loss_mode`` value)."""
    return POLICY_LOSSES.register(name)


def get_policy_loss(name: str) -> PolicyLoss:
    """The loss registered as ``name``; ``ValueError`` listing the valid names otherwise."""
    return POLICY_LOSSES.get(name)


class _Agg:
    """Binds mask, mode and global counts so each loss states only its math."""

    def __init__(
        self,
        mask: torch.Tensor,
        mode: str,
        global_num_tokens: Count | None,
        global_num_seqs: Count | None,
        norm_length: Count | None,
    ) -> None:
        self.mask = mask
        self.mode = mode
        self.counts = {
            "global_num_tokens": global_num_tokens,
            "global_num_seqs": global_num_seqs,
            "norm_length": norm_length,
        }

    def loss(self, loss_mat: torch.Tensor) -> torch.Tensor:
        return agg_loss(loss_mat, self.mask, self.mode, **self.counts)

    def token_mean(self, values: torch.Tensor) -> torch.Tensor:
        """Detached token mean, normalised by the global token count when one was given."""
        n_tok = self.counts["global_num_tokens"]
        return agg_loss(values.detach(), self.mask, "token-mean", global_num_tokens=n_tok)

    def diagnostics(
        self, log_ratio: torch.Tensor, clipped: torch.Tensor, clipped_lower: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        dtype = log_ratio.dtype
        zero = torch.zeros((), dtype=dtype, device=log_ratio.device)
        lower = zero if clipped_lower is None else self.token_mean(clipped_lower.to(dtype))
        return {
            "pg_clipfrac": self.token_mean(clipped.to(dtype)),
            "pg_clipfrac_lower": lower,
            "ppo_kl": self.token_mean(-log_ratio),
        }


def _clip_bounds(clip_ratio: float, low: float | None, high: float | None) -> tuple[float, float]:
    """``(1 - eps_lo, 1 + eps_hi)``; the asymmetric bounds default to the symmetric one."""
    eps_lo = clip_ratio if low is None else low
    eps_hi = clip_ratio if high is None else high
    return 1.0 - eps_lo, 1.0 + eps_hi


def _log_ratio(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, -LOG_RATIO_CLAMP, LOG_RATIO_CLAMP)


# ----------------------------------------------------------------------------- losses
# Each loss spells out the full shared signature so a misspelt keyword fails loudly.


@register_policy_loss("vanilla")
def vanilla_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
    norm_length: Count | None = None,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """PPO clipped surrogate (Schulman et al. 2017) with clip-higher and dual clip.

    ``l = max(-A rho, -A clip(rho, 1 - eps_lo, 1 + eps_hi))``; for ``A < 0`` the dual clip
    (Ye et al. 2020) caps it: ``l = min(l, -A c)``, so a token whose ratio exploded cannot push
    the loss without bound. ``eps_hi > eps_lo`` is DAPO's clip-higher. Requires ``c > 1``.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}")
    lo, hi = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    agg = _Agg(response_mask, loss_agg_mode, global_num_tokens, global_num_seqs, norm_length)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, lo, hi)
    ppo = torch.maximum(unclipped, clipped)
    dual_cap = -advantages * clip_ratio_c
    negative = advantages < 0
    loss_mat = torch.where(negative, torch.minimum(ppo, dual_cap), ppo)
    diagnostics = agg.diagnostics(log_ratio, clipped > unclipped, negative & (ppo > dual_cap))
    return agg.loss(loss_mat), diagnostics


@register_policy_loss("gspo")
def gspo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
    norm_length: Count | None = None,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GSPO (Zheng et al. 2025): PPO clipping on the sequence-level ratio.

    ``s_i = exp(mean_t (logp - old))`` (the length-normalised sequence likelihood ratio). The
    token form (GSPO-token) is ``s_it = sg[s_i] * pi_theta(y_t) / sg[pi_theta(y_t)]``: its VALUE is
    ``s_i`` at every token, its gradient flows through each token's own log-prob, so per-token
    advantages are allowed; with a per-sequence advantage and ``seq-mean-token-mean`` its gradient
    equals GSPO-seq's. ``log s_it`` is capped at 10 for stability, as verl. The paper (and verl)
    aggregate with ``seq-mean-token-mean``; this function honours ``loss_agg_mode`` as given.
    """
    lo, hi = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    agg = _Agg(response_mask, loss_agg_mode, global_num_tokens, global_num_seqs, norm_length)
    seq_log_ratio = masked_mean(log_prob - old_log_prob, response_mask, dim=-1)  # [B]
    log_s = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_s, max=10.0))
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, lo, hi)
    loss_mat = torch.maximum(unclipped, clipped)
    diagnostics = agg.diagnostics(_log_ratio(old_log_prob, log_prob), clipped > unclipped, None)
    return agg.loss(loss_mat), diagnostics


@register_policy_loss("gpg")
def gpg_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
    norm_length: Count | None = None,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """GPG (Chu et al. 2025): plain policy gradient ``l = -logp * A``; no ratio, no clipping.

    ``ppo_kl`` is still reported; the clip fractions are 0.
    """
    agg = _Agg(response_mask, loss_agg_mode, global_num_tokens, global_num_seqs, norm_length)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    diagnostics = agg.diagnostics(log_ratio, torch.zeros_like(log_ratio, dtype=torch.bool), None)
    return agg.loss(-log_prob * advantages), diagnostics


@register_policy_loss("cispo")
def cispo_policy_loss(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    loss_agg_mode: str,
    global_num_tokens: Count | None = None,
    global_num_seqs: Count | None = None,
    norm_length: Count | None = None,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """CISPO (MiniMax-M1, arXiv:2506.13585): ``l = -sg[clip(rho, 1 - eps_lo, 1 + eps_hi)] A logp``.

    Clipping the (detached) IS weight instead of the surrogate keeps every token's gradient.
    ``pg_clipfrac``: tokens whose weight was clipped at either bound; ``pg_clipfrac_lower``: at
    the lower bound.
    """
    lo, hi = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    agg = _Agg(response_mask, loss_agg_mode, global_num_tokens, global_num_seqs, norm_length)
    log_ratio = _log_ratio(old_log_prob, log_prob)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, lo, hi).detach()
    diagnostics = agg.diagnostics(log_ratio, (ratio > hi) | (ratio < lo), ratio < lo)
    return agg.loss(-weight * advantages * log_prob), diagnostics
