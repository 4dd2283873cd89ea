"""Which folders alignctl may write into, replace or delete: only its own.

Every folder alignctl creates as an output (a preprocess folder, a model, a run folder, an eval
report, a pipeline workdir) carries a marker file, :data:`MARKER`. The rules, applied before any
work starts and again at the moment of replacing:

- a new path, or an existing *empty* folder, may be written;
- an existing non-empty folder without the marker (the user's own files) is never written into,
  replaced or deleted: one-line error, whatever the flags;
- an existing alignctl folder is replaced only when the user asked for it (``--overwrite``);
- the current folder, the home folder, the filesystem root and any folder that holds the current
  folder or an input of the command are never an output, not even with ``--overwrite``.

Folders written by earlier alignctl versions (before the marker existed) are recognised by what
only alignctl writes into them: an artifact ``manifest.json`` naming alignctl, or a pipeline lock.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable
from pathlib import Path

from alignctl.errors import UserError

MARKER = ".alignctl-output"
_LEGACY_LOCK = ".alignctl.lock"


def mark_owned(folder: str | os.PathLike[str], kind: str) -> None:
    """Record in ``folder`` that alignctl created it (call right after creating it)."""
    from alignctl import __version__

    info = {"created_by": f"alignctl {__version__}", "kind": kind, "created_unix": time.time()}
    (Path(folder) / MARKER).write_text(json.dumps(info) + "\n", encoding="utf-8")


def is_owned(folder: str | os.PathLike[str]) -> bool:
    """True when ``folder`` was created by alignctl (this version or an earlier one)."""
    folder = Path(folder)
    if (folder / MARKER).is_file() or (folder / _LEGACY_LOCK).is_file():
        return True
    try:
        manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(manifest, dict) and "alignctl" in (manifest.get("versions") or {})


def is_empty_dir(folder: Path) -> bool:
    return folder.is_dir() and next(folder.iterdir(), None) is None


def protected_reason(dest: Path, inputs: Iterable[str | os.PathLike[str]] = ()) -> str | None:
    """Why ``dest`` may never be an output folder, or None."""
    cwd = Path.cwd().resolve()
    if dest == Path(dest.anchor):
        return "is the filesystem root"
    if dest == Path.home().resolve():
        return "is the home folder"
    if dest == cwd:
        return "is the current folder"
    if dest in cwd.parents:
        return "holds the current folder"
    for item in inputs:
        source = Path(item).expanduser().resolve()
        if dest == source or dest in source.parents:
            return f"holds the input {item}"
    return None


def _foreign(path: Path) -> bool:
    """A non-empty folder that alignctl did not write: never written into, replaced or deleted."""
    return path.is_dir() and not is_empty_dir(path) and not is_owned(path)


_FOREIGN = "folder exists and was not written by alignctl; refusing to replace it (choose a new folder)"


def check_output_dir(dest: str | os.PathLike[str], *, key: str, overwrite: bool,
                     inputs: Iterable[str | os.PathLike[str]] = ()) -> None:
    """Refuse (UserError) an output folder that alignctl may not write; see the module rules.
    Called before any work starts; :func:`check_replaceable` repeats the guard at the moment of
    replacing.

    ``key`` names the setting in the message (``--out``, ``output_dir``, ``trainer.run_dir``)."""
    path = Path(dest).expanduser().resolve()
    reason = protected_reason(path, inputs)
    if reason:
        raise UserError(f"{key} {dest}: refusing to write there, it {reason}; choose a new folder, e.g. "
                        f"{Path(dest) / 'out'}")
    if path.exists() and not path.is_dir():
        raise UserError(f"{key} {dest}: output path exists and is a file, expected a folder (or a new path)")
    if _foreign(path):
        raise UserError(f"{key} {dest}: {_FOREIGN}")
    if path.is_dir() and not is_empty_dir(path) and not overwrite:
        raise UserError(f"{key} {dest}: already holds an earlier alignctl output; pass --overwrite to replace "
                        f"it, or choose a new folder")


def check_replaceable(dest: Path) -> None:
    """The last guard before an existing folder is moved aside and deleted: never the user's own."""
    reason = protected_reason(dest.resolve())
    if reason:
        raise UserError(f"{dest}: refusing to replace this folder, it {reason}")
    if _foreign(dest):
        raise UserError(f"{dest}: {_FOREIGN}")
