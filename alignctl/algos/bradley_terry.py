"""Bradley-Terry pairwise loss for reward-model training (``alignctl train-rm``).

Notation:
    B: preference pairs, r_c[i] / r_r[i]: scalar rewards of the chosen / rejected response,
    m[i]: optional margin (how strongly the pair is preferred), c: center_rewards_coefficient

    loss = -mean_i log sigmoid(r_c - r_r - m) + c * mean_i (r_c + r_r)^2

P(chosen > rejected) = sigmoid(r_c - r_r) under Bradley-Terry (Ouyang et al. 2022). The margin
term follows Llama 2 (Touvron et al. 2023); the centring term (Eisenstein et al. 2023, as TRL's
``center_rewards_coefficient``) pulls the reward mean toward 0, since BT only fixes differences.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["bradley_terry_loss", "preference_accuracy"]


def bradley_terry_loss(
    chosen_rewards: torch.Tensor,
    rejected_rewards: torch.Tensor,
    margin: torch.Tensor | float | None = None,
    center_rewards_coefficient: float | None = None,
) -> torch.Tensor:
    """Scalar BT loss; ``chosen_rewards [B]``, ``rejected_rewards [B]``, ``margin [B]`` or scalar.

    ``logsigmoid`` keeps large negative differences finite (no log(0)).
    """
    diff = chosen_rewards - rejected_rewards
    if margin is not None:
        diff = diff - margin
    loss = -F.logsigmoid(diff).mean()
    if center_rewards_coefficient:
        loss = loss + center_rewards_coefficient * (chosen_rewards + rejected_rewards).square().mean()
    return loss


def preference_accuracy(chosen_rewards: torch.Tensor, rejected_rewards: torch.Tensor) -> torch.Tensor:
    """Fraction of pairs ranked correctly (ties count as wrong), detached scalar."""
    return (chosen_rewards > rejected_rewards).to(chosen_rewards.dtype).mean().detach()
