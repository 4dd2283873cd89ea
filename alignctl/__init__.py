"""alignctl: an end-to-end alignment CLI and library (preprocess -> sft -> train-rm -> RL -> eval).

Imports here stay light: heavy libraries (torch, transformers, ray) load only when the piece
that needs them is used.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

# Public API, loaded on first use: `import alignctl` itself imports nothing heavy.
_LAZY = {
    "PPOConfig": "alignctl.api",
    "RLHFTrainer": "alignctl.api",
    "RewardModelTrainer": "alignctl.trainers.rm_trainer",
    "evaluate": "alignctl.eval",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'alignctl' has no attribute {name!r}")
