"""The one way alignctl imports a Python file a user names (reward functions, map functions,
dataset classes, plugins). A leaf: standard library only, so every layer may use it.

Callers own their error messages: this returns None when the path cannot be loaded as Python,
and lets whatever the file raises propagate.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType


def import_file(name: str, path: str | os.PathLike[str]) -> ModuleType | None:
    """Execute ``path`` as module ``name``. The module is in ``sys.modules`` while it runs (so
    dataclasses and pickling inside it resolve) and stays there on success; a file that raises
    is removed again."""
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        return None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
