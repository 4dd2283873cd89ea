"""Plugins: user modules that add registry entries (advantage estimators, policy losses) by being
imported, in the controller and in every Ray worker, before any registry is read.

Two sources, both imported by :func:`load_plugins`:

- ``algorithm.plugins`` in the RL config: importable module names (``my_pkg.my_losses``) or
  ``.py`` files (``path/to/losses.py``, made absolute on the controller so workers find the same
  file whatever their working folder);
- installed packages that declare an entry point in the ``alignctl.plugins`` group
  (``[project.entry-points."alignctl.plugins"] my_losses = "my_pkg.my_losses"``).

Importing a plugin runs its code, like a custom reward function does (docs/security.md).
Each plugin is imported once per process: configs are built more than once (CLI, preflight,
each worker), and a second import would register a second copy of every function.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
from pathlib import Path
from types import ModuleType

from alignctl.errors import UserError
from alignctl.user_code import import_file

__all__ = ["ENTRY_POINT_GROUP", "PLUGINS_KEY", "import_roots", "load_plugins", "normalize_plugins", "where_plugins_come_from"]

ENTRY_POINT_GROUP = "alignctl.plugins"
PLUGINS_KEY = "algorithm.plugins"

_LOADED: dict[str, ModuleType] = {}  # by module name or absolute file path


def is_file_spec(spec: str) -> bool:
    return spec.endswith(".py") or "/" in spec or os.sep in spec


def normalize_plugins(specs: list[str], *, key: str = PLUGINS_KEY) -> list[str]:
    """File plugins as absolute paths (checked to exist), module names as given (checked to be
    dotted identifiers); one-line errors naming ``key``."""
    out: list[str] = []
    for spec in specs:
        spec = spec.strip()
        if is_file_spec(spec):
            path = Path(spec).expanduser().absolute()
            if not path.is_file():
                raise UserError(f"key {key!r}: plugin file {spec!r} not found; expected a .py file or an "
                                f"importable module name")
            out.append(str(path))
        elif spec and all(part.isidentifier() for part in spec.split(".")):
            out.append(spec)
        else:
            raise UserError(f"key {key!r}: {spec!r} is neither a .py file nor a module name (like my_pkg.losses)")
    return out


def load_plugins(specs: list[str], *, key: str = PLUGINS_KEY) -> list[str]:
    """Import every plugin in ``specs`` and every ``alignctl.plugins`` entry point not yet
    imported in this process; returns ``specs`` normalized (files as absolute paths)."""
    normalized = normalize_plugins(specs, key=key)
    for spec in normalized:
        if spec not in _LOADED:
            _LOADED[spec] = _import_file(spec, key) if is_file_spec(spec) else _import_module(spec, key)
    for entry in _entry_points():
        label = f"entry point {entry.name} = {entry.value}"
        if label not in _LOADED:
            try:
                _LOADED[label] = entry.load()
            except Exception as exc:  # noqa: BLE001 - a broken installed plugin is the user's problem to see
                dist = entry.dist.name if entry.dist is not None else "an installed package"
                raise UserError(f"plugin {label} (from {dist}, group {ENTRY_POINT_GROUP!r}) failed to import: "
                                f"{type(exc).__name__}: {exc}") from None
    return normalized


def _entry_points() -> list[importlib.metadata.EntryPoint]:
    return sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)


def _import_module(name: str, key: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise UserError(f"key {key!r}: no module named {name!r} (looked in the current folder and the "
                            f"Python path; a file needs its path, like plugins/{name.split('.')[-1]}.py)") from None
        raise UserError(f"key {key!r}: importing plugin {name!r} failed: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - whatever the user's module raises, say where
        raise UserError(f"key {key!r}: importing plugin {name!r} failed: {type(exc).__name__}: {exc}") from None


def _import_file(path: str, key: str) -> ModuleType:
    # A stable module name, so classes and functions defined there pickle by reference.
    name = "alignctl_plugin_" + "".join(c if c.isalnum() else "_" for c in Path(path).stem)
    try:
        module = import_file(name, path)
    except Exception as exc:  # noqa: BLE001 - SyntaxError included: one line naming the file
        raise UserError(f"key {key!r}: importing plugin file {path} failed: {type(exc).__name__}: {exc}") from None
    if module is None:
        raise UserError(f"key {key!r}: cannot import {path!r} as Python")
    return module


def import_roots(specs: list[str]) -> list[str]:
    """The folders on the controller's Python path that module plugins were found in: Ray workers
    start with only their working folder and site-packages on theirs, so they get these too."""
    roots: list[str] = []
    for spec in specs:
        if is_file_spec(spec):
            continue
        top = importlib.util.find_spec(spec.split(".")[0])
        if top is None or not top.origin or top.origin in ("built-in", "frozen"):
            continue
        origin = Path(top.origin)
        root = origin.parent.parent if top.submodule_search_locations else origin.parent
        if str(root) not in roots:
            roots.append(str(root))
    return roots


def where_plugins_come_from(specs: list[str]) -> str:
    """For unknown-name errors: what was imported and where plugins are looked up."""
    listed = ", ".join(specs) if specs else "none"
    entries = ", ".join(f"{e.name} = {e.value}" for e in _entry_points()) or "none installed"
    return (f"plugins register more: key {PLUGINS_KEY!r} (modules or .py files; now: {listed}) and entry points "
            f"of group {ENTRY_POINT_GROUP!r} ({entries})")
