"""Advantage estimators: the math behind ``algorithm.adv_estimator``.

Notation:
    B: responses in the batch, T: padded response length, G: number of prompt groups
    r[i, t]: token_level_rewards, m[i, t]: response_mask (1 = response token)
    s_i = sum_t m[i, t] r[i, t]: outcome score of response i
    g(i): group (prompt) of response i, n_g: responses in group g
    V[i, t]: critic values, gamma: discount, lam: GAE lambda

Every estimator is ``fn(token_level_rewards [B, T], response_mask [B, T], *, values=None,
group_index=None, baseline_rewards=None, gamma=1.0, lam=1.0, norm_adv_by_std=True, epsilon=1e-6)
-> (advantages [B, T], returns [B, T])`` and ignores the keywords it does not use. Outputs carry no
gradient. The registry that names them for the config, with what each needs from the loop (a
critic, groups, an extra rollout), is one layer up: ``alignctl/trainers/estimators.py``.

Shared rules:
    * outputs are 0 at masked positions; inputs at masked positions (rewards, values) are never read
      into a result, so junk there changes nothing;
    * masked positions inside a response (multi-turn observation tokens) are skipped by the
      recursions: the running return / GAE state and the next value carry through them undiscounted;
    * a group whose scores are all equal (including a singleton group) gets advantage exactly 0 in
      the group-baseline estimators (grpo, rloo, opo, reinforce_plus_plus_baseline, grpo_passk);
    * an all-empty mask gives all-zero outputs, never NaN.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from alignctl.algos.masked import masked_whiten, safe_div

__all__ = [
    "GroupIndex",
    "discounted_returns",
    "gae_advantages",
    "grpo_advantages",
    "grpo_passk_advantages",
    "group_ids",
    "opo_advantages",
    "reinforce_plus_plus_advantages",
    "reinforce_plus_plus_baseline_advantages",
    "remax_advantages",
    "rloo_advantages",
]

GroupIndex = torch.Tensor | Sequence[Hashable]


# ----------------------------------------------------------------------------- helpers


def group_ids(group_index: GroupIndex, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Dense group ids ``[B]`` (int64, 0..G-1) and ``G`` from any group labels.

    ``group_index`` is an int tensor ``[B]`` or a sequence of hashable ids (e.g. the uid strings
    the controller attaches to the ``n`` samples of one prompt).
    """
    if isinstance(group_index, torch.Tensor):
        if group_index.shape != (batch_size,):
            raise ValueError(f"group_index must have shape ({batch_size},), got {tuple(group_index.shape)}")
        uniq, inverse = torch.unique(group_index, return_inverse=True)
        return inverse.to(device=device, dtype=torch.long), uniq.numel()
    labels = list(group_index)
    if len(labels) != batch_size:
        raise ValueError(f"group_index must have {batch_size} entries, got {len(labels)}")
    dense: dict[Hashable, int] = {}
    ids = [dense.setdefault(label, len(dense)) for label in labels]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def _group_reduce(x: torch.Tensor, gid: torch.Tensor, num_groups: int, reduce: str) -> torch.Tensor:
    """Per-group ``sum`` / ``amax`` / ``amin`` of ``x [B]`` -> ``[G]``."""
    out = torch.zeros(num_groups, dtype=x.dtype, device=x.device)
    return out.scatter_reduce(0, gid, x, reduce=reduce, include_self=False)


class _Groups:
    """Per-response group statistics of scores ``s [B]``: count, mean, unbiased std, all-equal."""

    def __init__(self, scores: torch.Tensor, group_index: GroupIndex | None, name: str) -> None:
        if group_index is None:
            raise ValueError(f"advantage estimator {name!r} needs group_index (the prompt id of each response)")
        self.gid, self.num_groups = group_ids(group_index, scores.shape[0], scores.device)
        count = self.reduce(torch.ones_like(scores), "sum")
        mean = self.reduce(scores, "sum") / count
        dev = scores - mean[self.gid]
        var = safe_div(self.reduce(dev**2, "sum"), count - 1)  # singleton: 0, not NaN
        self.count = count[self.gid]
        self.dev = dev
        self.std = var.sqrt()[self.gid]
        # Exact test instead of std == 0: sum/n can miss an all-equal value by one ulp.
        self.all_equal = (self.reduce(scores, "amax") == self.reduce(scores, "amin"))[self.gid]

    def reduce(self, x: torch.Tensor, how: str) -> torch.Tensor:
        return _group_reduce(x, self.gid, self.num_groups, how)

    def zero_if_flat(self, adv: torch.Tensor) -> torch.Tensor:
        return torch.where(self.all_equal, torch.zeros_like(adv), adv)


def _scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """``s_i = sum_t m r`` ``[B]``; rewards at masked positions are ignored."""
    keep = response_mask.bool()
    return torch.where(keep, token_level_rewards, 0.0).sum(dim=-1)


def _per_token(x: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """Broadcast a per-response ``[B]`` value over response tokens; 0 on masked tokens."""
    return torch.where(response_mask.bool(), x.unsqueeze(-1), 0.0)


def discounted_returns(token_level_rewards: torch.Tensor, response_mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """Return-to-go ``G_t = r_t + gamma * G_{next valid}`` over valid tokens ``[B, T] -> [B, T]``.

    Masked positions are skipped (the running return passes through them undiscounted) and are 0
    in the output; on right-padded masks this equals the plain reverse discounted cumsum.
    """
    keep = response_mask.bool()
    rewards = torch.where(keep, token_level_rewards, 0.0)
    if gamma == 1.0:  # no discount: skipping masked (zero-reward) positions changes nothing
        return torch.where(keep, rewards.flip(-1).cumsum(-1).flip(-1), 0.0)
    running = torch.zeros_like(rewards[:, 0])
    out = []
    for t in reversed(range(rewards.shape[-1])):
        running = torch.where(keep[:, t], rewards[:, t] + gamma * running, running)
        out.append(torch.where(keep[:, t], running, 0.0))
    return torch.stack(out[::-1], dim=-1)


# ----------------------------------------------------------------------------- estimators
# Each estimator spells out the full shared signature (rather than ``**kwargs``) so a misspelt
# keyword fails loudly instead of being silently ignored.


@torch.no_grad()
def gae_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    baseline_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2015), as in PPO-RLHF.

    ``delta_t = r_t + gamma * V_next - V_t``, ``A_t = delta_t + gamma * lam * A_next`` where
    ``next`` is the next VALID position (masked positions are skipped, as verl's multi-turn GAE).
    ``returns = A + V`` (the critic target); advantages are then whitened over all valid tokens
    of the batch. Needs ``values [B, T]``.
    """
    if values is None:
        raise ValueError("advantage estimator 'gae' needs values (critic predictions, shape [B, T])")
    keep = response_mask.bool()
    rewards = torch.where(keep, token_level_rewards, 0.0)
    vals = torch.where(keep, values, 0.0)
    next_value = torch.zeros_like(rewards[:, 0])
    next_adv = torch.zeros_like(rewards[:, 0])
    out = []
    for t in reversed(range(rewards.shape[-1])):
        adv_t = rewards[:, t] + gamma * next_value - vals[:, t] + gamma * lam * next_adv
        next_value = torch.where(keep[:, t], vals[:, t], next_value)
        next_adv = torch.where(keep[:, t], adv_t, next_adv)
        out.append(torch.where(keep[:, t], adv_t, 0.0))
    raw = torch.stack(out[::-1], dim=-1)
    returns = torch.where(keep, raw + vals, 0.0)
    return masked_whiten(raw, response_mask), returns


@torch.no_grad()
def grpo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    baseline_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024): ``A_i = (s_i - mean_g) / (std_g + epsilon)``.

    ``std_g`` is the unbiased (n-1) group std, as ``torch.std``. ``norm_adv_by_std=False`` gives
    Dr.GRPO's ``A_i = s_i - mean_g`` (Liu et al. 2025). Needs ``group_index``.
    """
    groups = _Groups(_scores(token_level_rewards, response_mask), group_index, "grpo")
    adv = groups.dev / (groups.std + epsilon) if norm_adv_by_std else groups.dev
    adv = _per_token(groups.zero_if_flat(adv), response_mask)
    return adv, adv


@torch.no_grad()
def rloo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    baseline_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024): ``A_i = s_i - mean_{j != i in g} s_j = n/(n-1) (s_i - mean_g)``.

    Needs ``group_index``; singleton groups (no other sample to compare with) get 0.
    """
    groups = _Groups(_scores(token_level_rewards, response_mask), group_index, "rloo")
    adv = safe_div(groups.dev * groups.count, groups.count - 1)
    adv = _per_token(groups.zero_if_flat(adv), response_mask)
    return adv, adv


@torch.no_grad()
def opo_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    baseline_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """OPO (Hao et al. 2025): length-weighted group baseline ``b_g = sum n_i s_i / sum n_i``.

    ``n_i`` = valid tokens of response i; ``A_i = s_i - b_g``. Needs ``group_index``.
    """
    scores = _scores(token_level_rewards, response_mask)
    groups = _Groups(scores, group_index, "opo")
    lengths = response_mask.bool().sum(dim=-1).to(scores.dtype)
    baseline = safe_div(groups.reduce(lengths * scores, "sum"), groups.reduce(lengths, "sum"))
    adv = _per_token(groups.zero_if_flat(scores - baseline[groups.gid]), response_mask)
    return adv, adv


@torch.no_grad()
def reinforce_plus_plus_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    baseline_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025): discounted return-to-go ``G_t``, whitened over the batch's tokens.

    ``returns = G`` (un-whitened), ``advantages = whiten(G)``.
    """
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    return masked_whiten(returns, response_mask), returns


@torch.no_grad()
def reinforce_plus_plus_baseline_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    baseline_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: ``s_i - mean_g`` broadcast over tokens, whitened over the batch.

    Needs ``group_index``.
    """
    groups = _Groups(_scores(token_level_rewards, response_mask), group_index, "reinforce_plus_plus_baseline")
    centred = _per_token(groups.zero_if_flat(groups.dev), response_mask)
    adv = masked_whiten(centred, response_mask)
    return adv, adv


@torch.no_grad()
def remax_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    baseline_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023): ``A_t = G_t - b_i`` with ``b_i`` the greedy response's reward.

    ``G`` is the return-to-go (undiscounted at the default ``gamma=1``). Needs
    ``baseline_rewards [B]``.
    """
    if baseline_rewards is None:
        raise ValueError("advantage estimator 'remax' needs baseline_rewards (greedy-response reward, shape [B])")
    returns = discounted_returns(token_level_rewards, response_mask, gamma)
    adv = torch.where(response_mask.bool(), returns - baseline_rewards.unsqueeze(-1), 0.0)
    return adv, returns


@torch.no_grad()
def grpo_passk_advantages(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    *,
    values: torch.Tensor | None = None,
    group_index: GroupIndex | None = None,
    baseline_rewards: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k GRPO (Chen et al. 2025, arXiv:2503.19595), as verl.

    Only the best response of each group (lowest index among ties) gets a non-zero advantage,
    ``max_g - second_max_g``, divided by ``std_g + epsilon`` when ``norm_adv_by_std``. Singleton
    groups have no second sample and get 0. Needs ``group_index``.
    """
    scores = _scores(token_level_rewards, response_mask)
    groups = _Groups(scores, group_index, "grpo_passk")
    top = groups.reduce(scores, "amax")
    idx = torch.arange(scores.shape[0], device=scores.device)
    first_at_top = torch.where(scores == top[groups.gid], idx, scores.shape[0])
    best = idx == groups.reduce(first_at_top, "amin")[groups.gid]
    others = torch.where(best, torch.full_like(scores, float("-inf")), scores)
    second = groups.reduce(others, "amax")[groups.gid]
    gap = top[groups.gid] - second
    if norm_adv_by_std:
        gap = gap / (groups.std + epsilon)
    adv = torch.where(best & (groups.count > 1), gap, 0.0)
    adv = _per_token(groups.zero_if_flat(adv), response_mask)
    return adv, adv
