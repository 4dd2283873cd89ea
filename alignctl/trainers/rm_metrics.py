"""Held-out metrics of a reward model from its scores on preference pairs. Pure torch.

Notation:
    N: pairs, r_c[i] / r_r[i]: rewards of the chosen / rejected reply of pair i,
    m[i] = r_c[i] - r_r[i]: the predicted margin.

Under Bradley-Terry the model claims P(chosen preferred) = sigmoid(m). The calibration table
buckets pairs by |m| and sets the observed accuracy in each bucket beside the accuracy the model
claims there, mean(sigmoid(|m|)): a calibrated model has the two close, an over-confident one
claims more than it gets.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from alignctl.algos.bradley_terry import bradley_terry_loss, preference_accuracy

__all__ = ["CalibrationBucket", "GroupAccuracy", "accuracy_by_group", "calibration_table", "preference_metrics"]


def preference_metrics(chosen: torch.Tensor, rejected: torch.Tensor) -> dict[str, float]:
    """``chosen [N]``, ``rejected [N]`` -> accuracy, margin, BT loss and the reward distribution.

    ``reward_mean`` / ``reward_std`` are over all 2N rewards (population std): the constants a
    later stage subtracts and divides by to normalise this model's rewards."""
    chosen, rejected = chosen.double(), rejected.double()
    both = torch.cat([chosen, rejected])
    return {
        "accuracy": float(preference_accuracy(chosen, rejected)),
        "margin_mean": float((chosen - rejected).mean()),
        "loss": float(bradley_terry_loss(chosen, rejected)),
        "reward_mean": float(both.mean()),
        "reward_std": float(both.std(unbiased=False)),
        "chosen_reward_mean": float(chosen.mean()),
        "rejected_reward_mean": float(rejected.mean()),
        "pairs": float(chosen.numel()),
    }


@dataclass(frozen=True)
class CalibrationBucket:
    """Pairs with ``low <= |margin| < high``; accuracies are NaN for an empty bucket."""

    low: float
    high: float
    count: int
    accuracy: float
    claimed_accuracy: float

    def label(self) -> str:
        return f"[{self.low:g}, {self.high:g})" if math.isfinite(self.high) else f">= {self.low:g}"


def calibration_table(chosen: torch.Tensor, rejected: torch.Tensor, edges: list[float]) -> list[CalibrationBucket]:
    """Accuracy by |margin| bucket; ``edges`` are the increasing inner boundaries (0 and +inf are
    added), e.g. [0.5, 1] -> [0, 0.5), [0.5, 1), >= 1."""
    margin = (chosen - rejected).double()
    size = margin.abs()
    bounds = [0.0, *edges, math.inf]
    table = []
    for low, high in zip(bounds[:-1], bounds[1:]):
        inside = (size >= low) & (size < high)
        count = int(inside.sum())
        if count == 0:
            table.append(CalibrationBucket(low, high, 0, math.nan, math.nan))
            continue
        accuracy = float((margin[inside] > 0).double().mean())
        claimed = float(torch.sigmoid(size[inside]).mean())
        table.append(CalibrationBucket(low, high, count, accuracy, claimed))
    return table


@dataclass(frozen=True)
class GroupAccuracy:
    """Held-out pairs whose group label is ``group`` and the share of them ranked right."""

    group: str
    count: int
    accuracy: float


def accuracy_by_group(chosen: torch.Tensor, rejected: torch.Tensor, groups: list[str]) -> list[GroupAccuracy]:
    """Accuracy (ties count as wrong) of the pairs of each group, groups sorted by name.

    One overall number can hide a reward model that has learned only the easy kind of pair (on
    arith: a final number that disagrees with the worked steps) and guesses on the rest."""
    from alignctl.audit.checks import accuracy_by_group as shares_by_group  # the audit's per-group count

    table = shares_by_group((chosen > rejected).tolist(), groups)
    return [GroupAccuracy(name, int(row["pairs"]), float(row["accuracy"])) for name, row in table.items()]
