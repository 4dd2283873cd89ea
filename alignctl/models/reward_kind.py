"""Which kind of reward model a folder holds, from its config alone (no torch, no transformers):
a ``*ForSequenceClassification`` with a score head, or a causal LM that scores a reply by its
likelihood (``train-rm`` with ``score_from: likelihood``; :mod:`alignctl.models.reply_likelihood`),
marked by keys train-rm writes into its config."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REWARD_KIND_KEY = "alignctl_reward_kind"
LIKELIHOOD = "likelihood"
REPLY_MARKER_KEY = "alignctl_reply_marker"
BETA_KEY = "alignctl_likelihood_beta"


def mark_likelihood_reward_model(config: Any, marker: Sequence[int], beta: float) -> None:
    """Record in a causal LM's config that it is a likelihood reward model, and how it scores."""
    setattr(config, REWARD_KIND_KEY, LIKELIHOOD)
    setattr(config, REPLY_MARKER_KEY, [int(t) for t in marker])
    setattr(config, BETA_KEY, float(beta))
    config.num_labels = 1  # TRL's RewardTrainer checks it; the scores come from the patched forward


def likelihood_settings(config: Any) -> tuple[list[int], float] | None:
    """(reply marker, beta) of a likelihood reward model's config; None for any other model."""
    if getattr(config, REWARD_KIND_KEY, None) != LIKELIHOOD:
        return None
    return [int(t) for t in getattr(config, REPLY_MARKER_KEY, None) or []], float(getattr(config, BETA_KEY, 1.0))


def is_likelihood_reward_folder(path: str | Path) -> bool:
    """Whether the folder's config.json marks a likelihood reward model (read as JSON, no transformers)."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and config.get(REWARD_KIND_KEY) == LIKELIHOOD
