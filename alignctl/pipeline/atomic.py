"""Atomic output folders (and single files): work happens in a hidden temporary sibling that is
renamed into place.

A reader therefore sees either nothing or the complete folder, never half-written output, even
when the writer crashes or is killed. The temporary folder lives next to the destination so the
final ``os.replace`` stays on one filesystem (rename is atomic only there).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from alignctl.errors import UserError
from alignctl.pipeline.ownership import check_replaceable, is_empty_dir, mark_owned


def _check_parent_writable(dest: Path) -> Path:
    parent = dest.parent
    probe = parent
    while not probe.exists():
        probe = probe.parent
    if not probe.is_dir():
        raise UserError(f"{dest}: cannot create output folder, {probe} is a file, not a folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UserError(f"{dest}: output location is not writable ({probe} denies write access)")
    return parent


@contextlib.contextmanager
def atomic_output_dir(dest: str | os.PathLike[str], *, overwrite: bool = True,
                      kind: str = "artifact") -> Iterator[Path]:
    """Yield a fresh temporary folder; on success it replaces ``dest``, on error it is removed.

    Only an empty folder or one alignctl wrote may be replaced (:mod:`alignctl.pipeline.ownership`);
    ``overwrite=False`` refuses to replace an existing non-empty ``dest`` at all (UserError). The
    new folder carries the ownership marker, so a later run may replace it.
    """
    dest = Path(dest).expanduser().absolute()
    if dest.is_symlink():  # keep the user's link: the folder it points at is the output
        dest = dest.resolve()
    if dest.exists() and not dest.is_dir():
        raise UserError(f"{dest}: output path exists and is a file, expected a folder")
    if dest.exists():
        check_replaceable(dest)
        if not overwrite and not is_empty_dir(dest):
            raise UserError(f"{dest}: output already exists (pass --overwrite to replace it)")
    parent = _check_parent_writable(dest)
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"{dest}: cannot create output folder ({exc.strerror})") from None
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=parent))
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)  # mkdtemp makes 0700; the artifact should read like any new folder
    try:
        mark_owned(tmp, kind)
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _replace_dir(tmp, dest)


def _replace_dir(tmp: Path, dest: Path) -> None:
    """Move ``tmp`` to ``dest``; an existing ``dest`` is moved aside first and deleted after, so
    there is no moment where a reader could see a mix of old and new files."""
    old = None
    if dest.exists():
        old = dest.with_name(f".{dest.name}.old-{os.getpid()}")
        os.replace(dest, old)
    os.replace(tmp, dest)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def atomic_write_text(path: str | os.PathLike[str], text: str) -> None:
    """Write a whole text file so that readers see the old content or the new, never a torn file:
    into a hidden sibling, then renamed over ``path`` (checkpoint pointer, truncated metrics)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
