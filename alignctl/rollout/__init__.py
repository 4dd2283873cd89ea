"""Rollout (generation) engines behind one interface.

Engines are registry entries (``rollout/registry.py``) that declare what they support.
``get_rollout_engine("hf", model=module)`` builds one from explicit keyword arguments (tests, eval,
benchmarks); the RL actor builds its engine from the rollout config with
:func:`build_rollout_engine`. Engine modules are imported lazily so ``import alignctl.rollout``
stays light: the registry is read by config validation, which must not import torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from alignctl.rollout.registry import (
    ROLLOUT_ENGINES,
    EngineCapabilities,
    EngineEntry,
    build_rollout_engine,
    engine_entry,
    register_rollout_engine,
)

if TYPE_CHECKING:
    from alignctl.rollout.engine import RolloutEngine, RolloutOutput, RolloutSetup, SamplingParams

_FROM_BASE = ("RolloutEngine", "RolloutOutput", "RolloutSetup", "SamplingParams")


def __getattr__(name: str) -> Any:
    if name in _FROM_BASE:  # the engine contract imports torch: only on first use
        return getattr(importlib.import_module("alignctl.rollout.engine"), name)
    raise AttributeError(f"module 'alignctl.rollout' has no attribute {name!r}")


def get_rollout_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Build the engine registered under ``name`` with engine-specific keyword arguments."""
    if name not in ROLLOUT_ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; expected one of: {', '.join(sorted(ROLLOUT_ENGINES))}")
    engine: RolloutEngine = ROLLOUT_ENGINES[name].load_class()(**kwargs)
    return engine


__all__ = ["ROLLOUT_ENGINES", "EngineCapabilities", "EngineEntry", "RolloutEngine", "RolloutOutput", "RolloutSetup",
           "SamplingParams", "build_rollout_engine", "engine_entry", "get_rollout_engine", "register_rollout_engine"]
