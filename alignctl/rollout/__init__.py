"""Rollout (generation) engines behind one interface.

``get_rollout_engine("hf", model=module)`` runs in-process on the training module (default);
``get_rollout_engine("vllm", model_path=..., ...)`` uses vLLM (optional extra, CUDA only). Engine
modules are imported lazily so ``import alignctl.rollout`` stays light.
"""

from __future__ import annotations

import importlib
from typing import Any

from alignctl.rollout.base import RolloutEngine, RolloutOutput, SamplingParams

# name -> "module:Class"; resolved on first use.
ROLLOUT_ENGINES: dict[str, str] = {
    "hf": "alignctl.rollout.hf_engine:HFRolloutEngine",
    "vllm": "alignctl.rollout.vllm_engine:VLLMRolloutEngine",
}


def get_rollout_engine(name: str, **kwargs: Any) -> RolloutEngine:
    """Build the engine registered under ``name`` with engine-specific keyword arguments."""
    if name not in ROLLOUT_ENGINES:
        raise ValueError(f"unknown rollout engine {name!r}; expected one of: {', '.join(sorted(ROLLOUT_ENGINES))}")
    module_name, cls_name = ROLLOUT_ENGINES[name].split(":")
    cls = getattr(importlib.import_module(module_name), cls_name)
    engine: RolloutEngine = cls(**kwargs)
    return engine


__all__ = ["ROLLOUT_ENGINES", "RolloutEngine", "RolloutOutput", "SamplingParams", "get_rollout_engine"]
