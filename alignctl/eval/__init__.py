"""Evaluation: win rate against a reference under a reward model, rule accuracy, preference
consistency, RL training curves, and a report (``results.json``, ``report.md``, ``report.html``).

    results = evaluate(model="runs/ppo/actor", prompts="data/arith/test.parquet",
                       reward_model="runs/rm", reference="runs/sft")
    results.win_rate, results.win_rate_ci, results.lc_win_rate, results.mean_reward

Modules: ``stats`` (pure math), ``data`` (inputs), ``generate`` / ``scoring`` / ``accuracy``
(models and rule scorers), ``curves`` (run metrics), ``plots`` / ``report`` (outputs), ``runner``
(the stage). Attributes load lazily so ``import alignctl.eval`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "evaluate": "alignctl.eval.evaluation",
    "run_eval": "alignctl.eval.evaluation",
    "print_eval_report": "alignctl.eval.evaluation",
    "EvalResults": "alignctl.eval.results",
}

__all__ = list(_LAZY)


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'alignctl.eval' has no attribute {name!r}")
