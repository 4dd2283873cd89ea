"""Rule scorers, user reward functions and reward managers.

    gsm8k_scorer.compute_score   GSM8K ``#### N`` answers, compared as numbers
    math_scorer.compute_score    math-verify equivalence under a hard per-item timeout
    default_compute_score        picks one of them from the row's data_source (rule_scorers.py)
    load_reward_function         a user's ``compute_score`` from a Python file (reward_function.py)
    build_reward_manager         a registered manager (naive / batch / dapo / a plugin's):
                                 responses -> token-level scores

Importing this package stays light (no torch, transformers, ray, math_verify): it is imported by
every scoring worker process. The managers (which need torch) load on first attribute access.
"""

from __future__ import annotations

from typing import Any

from alignctl.rewards.reward_function import RewardFunction, check_score, load_reward_function
from alignctl.rewards.rule_scorers import default_compute_score, scorer_name

_LAZY = {
    "RewardInputs": "alignctl.rewards.managers",
    "RewardOutput": "alignctl.rewards.managers",
    "RewardManager": "alignctl.rewards.managers",
    "REWARD_MANAGERS": "alignctl.rewards.managers",
    "build_reward_manager": "alignctl.rewards.managers",
}

__all__ = [
    "RewardFunction",
    "check_score",
    "default_compute_score",
    "load_reward_function",
    "scorer_name",
    *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'alignctl.rewards' has no attribute {name!r}")
