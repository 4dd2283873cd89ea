"""What a preflight check needs to know besides the config: which paths will only exist later."""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Context:
    """``pending``: folders an upstream pipeline stage will create (nothing under them is checked
    yet); ``overwrite``: the user passed ``--overwrite``; ``outputs``: check the output folder
    (the pipeline runner owns its artifact folders and checks them itself); ``offline_ok``: a hub
    model id that cannot be reached only warns (a dry run on a machine without network);
    ``python_scorer``: the Python API scores training responses with a callable, so rows need no
    ground truth."""

    overwrite: bool = False
    pending: Collection[str] = ()
    outputs: bool = True
    offline_ok: bool = False
    python_scorer: bool = False
    _pending_paths: list[Path] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self._pending_paths = [Path(p).absolute() for p in self.pending]

    def later(self, path: str | os.PathLike[str]) -> bool:
        """True when ``path`` lies in a folder that an upstream stage has yet to write."""
        target = Path(path).expanduser().absolute()
        return any(target == p or p in target.parents for p in self._pending_paths)
