"""alignctl: an end-to-end alignment CLI and library (preprocess -> sft -> train-rm -> RL -> eval).

Imports here stay light: heavy libraries (torch, transformers, ray) load only when the piece
that needs them is used.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
