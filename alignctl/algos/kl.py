"""Token-level KL estimators between the policy and the reference model.

Config: ``algorithm.kl_penalty`` (KL folded into the reward) and
``actor_rollout_ref.actor.kl_loss_type`` (KL added to the actor loss).

Notation (Schulman 2020, "Approximating KL divergence"):
    logp = log pi_theta(y_t), ref = log pi_ref(y_t), x = logp - ref (samples come from pi_theta)
    k1 = x                                  unbiased for KL(pi_theta || pi_ref), high variance
    abs = |x|
    k2 = x^2 / 2                            biased value, but its gradient is the KL's gradient
    k3 = exp(-x) - 1 + x                    unbiased, non-negative, low variance; exp argument
                                            clamped to [-20, 20] and the result to [-10, 10], as verl
    k1+, k3+ (any kind + "+"): straight-through (Liu et al. 2025, arXiv:2505.17508):
        value of the named estimator, gradient of k2: ``k + (k2 - sg[k2])``.

Aliases: ``kl`` = k1, ``mse`` = k2, ``low_var_kl`` = k3 (verl's names).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from alignctl.algos.masked import masked_mean

__all__ = ["KL_PENALTY_KINDS", "kl_penalty", "kl_penalized_rewards"]


def _k1(x: torch.Tensor) -> torch.Tensor:
    return x


def _abs(x: torch.Tensor) -> torch.Tensor:
    return x.abs()


def _k2(x: torch.Tensor) -> torch.Tensor:
    return 0.5 * x.square()


def _k3(x: torch.Tensor) -> torch.Tensor:
    neg = torch.clamp(-x, -20.0, 20.0)  # log(pi_ref / pi_theta), clamped so exp cannot overflow
    return torch.clamp(torch.exp(neg) - neg - 1.0, -10.0, 10.0)


_BASE: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": _k1,
    "kl": _k1,
    "abs": _abs,
    "k2": _k2,
    "mse": _k2,
    "k3": _k3,
    "low_var_kl": _k3,
}

KL_PENALTY_KINDS: tuple[str, ...] = tuple(_BASE) + tuple(f"{name}+" for name in _BASE)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kind: str) -> torch.Tensor:
    """Per-token KL estimate of ``kind`` (see module docstring); shapes ``[B, T] -> [B, T]``.

    Gradients flow to both inputs (the reference is normally a constant anyway).
    """
    straight_through = kind.endswith("+")
    base = _BASE.get(kind[:-1] if straight_through else kind)
    if base is None:
        raise ValueError(f"unknown KL penalty kind {kind!r}; valid kinds: {', '.join(KL_PENALTY_KINDS)}")
    x = logprob - ref_logprob
    value = base(x)
    if not straight_through or base is _k2:
        return value
    k2 = _k2(x)
    return value.detach() + (k2 - k2.detach())


def kl_penalized_rewards(
    token_level_scores: torch.Tensor,
    log_prob: torch.Tensor,
    ref_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    kl_coef: float,
    kind: str,
) -> tuple[torch.Tensor, torch.Tensor]:
    """In-reward KL penalty (``algorithm.use_kl_in_reward``): ``r = score - beta * kl``.

    Args:
        token_level_scores: ``[B, T]`` task rewards (usually the outcome score on the last token).
        log_prob, ref_log_prob: ``[B, T]`` behaviour-policy and reference log-probs.
        response_mask: ``[B, T]``.
        kl_coef: ``beta`` (the KL controller's current ``value``).
        kind: ``algorithm.kl_penalty``.

    Returns:
        ``(token_level_rewards [B, T], batch_kl scalar)``; rewards are 0 at masked positions and
        ``batch_kl`` is the mean over sequences of each sequence's token-mean KL, the quantity the
        adaptive controller tracks (verl's ``actor/reward_kl_penalty``).
    """
    kl = kl_penalty(log_prob, ref_log_prob, kind).detach()
    keep = response_mask.bool()
    rewards = torch.where(keep, token_level_scores - kl_coef * kl, 0.0)
    batch_kl = masked_mean(kl, response_mask, dim=-1).mean()
    return rewards, batch_kl
