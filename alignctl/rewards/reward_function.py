"""User reward functions: load one from a Python file, and check what scorers return.

verl's contract, which a verl user's file keeps working under::

    def compute_score(data_source, solution_str, ground_truth, extra_info) -> float | dict

A dict return carries ``score`` plus extra per-sample metrics (e.g. ``{"score": 1.0, "acc": True,
"pred": "18"}``); the reward managers log the extras.

``load_reward_function`` returns a ``RewardFunction``: callable like the user's function, and
picklable by *path and name*, so it can be sent to a scoring worker process (a function from a
file loaded by path has no importable module name, so plain pickling could not find it there).
"""

from __future__ import annotations

import hashlib
import math
import numbers
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from alignctl.errors import UserError
from alignctl.user_code import import_file

_MODULES: dict[str, ModuleType] = {}
_MODULES_LOCK = threading.Lock()


def _import_file(path: Path) -> ModuleType:
    """Import ``path`` once per process and version of the file, under a private module name
    (an edited file is re-imported rather than served stale)."""
    stat = path.stat()
    key = f"{path}:{stat.st_mtime_ns}:{stat.st_size}"
    with _MODULES_LOCK:
        if key in _MODULES:
            return _MODULES[key]
        name = "alignctl_user_reward_" + hashlib.sha1(key.encode()).hexdigest()[:12]
        try:
            module = import_file(name, path)
        except SyntaxError as exc:
            raise UserError(f"syntax error in reward function file {path} line {exc.lineno}: {exc.msg}") from exc
        except Exception as exc:
            raise UserError(f"importing reward function file {path} raised {type(exc).__name__}: {exc}") from exc
        if module is None:
            raise UserError(f"reward function file {path} cannot be imported as Python (expected a .py file)")
        _MODULES[key] = module
        return module


def _resolve(path: Path, name: str) -> Callable[..., Any]:
    module = _import_file(path)
    if not hasattr(module, name):
        defined = sorted(k for k, v in vars(module).items() if callable(v) and not k.startswith("_"))
        raise UserError(
            f"reward function file {path} has no function {name!r} (callables defined there: "
            f"{', '.join(defined) or 'none'})"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise UserError(f"{name!r} in reward function file {path} is not callable (it is a {type(fn).__name__})")
    return fn


class RewardFunction:
    """A function loaded from a file; pickles as ``(path, name)`` and re-loads on the other side."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.name = name
        self.fn = _resolve(path, name)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __getstate__(self) -> tuple[str, str]:
        return (str(self.path), self.name)

    def __setstate__(self, state: tuple[str, str]) -> None:
        self.__init__(Path(state[0]), state[1])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"reward function {self.name!r} in {self.path}"


def load_reward_function(path: str | Path, name: str = "compute_score") -> RewardFunction:
    """Import the Python file at ``path`` and return its function ``name``.

    Raises UserError (one line) for a missing file, a syntax or import error in it, a missing
    name, or a name that is not callable.
    """
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise UserError(f"reward function file not found: {path}")
    return RewardFunction(resolved, name)


def describe_function(fn: Callable[..., Any]) -> str:
    """How error messages name a scorer."""
    if isinstance(fn, RewardFunction):
        return repr(fn)
    inner = getattr(fn, "func", fn)  # functools.partial
    module = getattr(inner, "__module__", None)
    qualname = getattr(inner, "__qualname__", None) or type(inner).__name__
    return f"reward function {module}.{qualname}" if module else f"reward function {qualname}"


@dataclass(frozen=True)
class Score:
    """One checked scorer result: the scalar reward plus extra per-sample metrics."""

    score: float
    extra: dict[str, Any] = field(default_factory=dict)


def _as_finite_float(value: Any) -> float | None:
    # bool is accepted on purpose (many verifiers return "is correct"); numpy scalars register
    # themselves as numbers.Real.
    if isinstance(value, numbers.Real):
        as_float = float(value)
        return as_float if math.isfinite(as_float) else None
    return None


def check_score(value: Any, fn: Callable[..., Any]) -> Score:
    """Validate what ``fn`` returned for one sample: a finite number, or a dict with a finite
    number under ``score``. Anything else is a UserError naming the function and the value."""
    raw = value.get("score") if isinstance(value, dict) else value
    if isinstance(value, dict) and "score" not in value:
        problem = f"a dict without 'score' (keys: {', '.join(map(str, value)) or 'none'})"
    else:
        as_float = _as_finite_float(raw)
        if as_float is not None:
            extra = {k: v for k, v in value.items() if k != "score"} if isinstance(value, dict) else {}
            return Score(as_float, extra)
        problem = f"{_short_repr(raw)} ({type(raw).__name__})"
    raise UserError(
        f"{describe_function(fn)} returned {problem}; expected a finite number or a dict with a "
        "finite number under 'score'"
    )


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
