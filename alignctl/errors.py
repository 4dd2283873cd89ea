"""User-facing errors.

A ``UserError`` is a mistake in the user's input (a file, a row, a config key). The CLI prints its
message as one line and exits with status 2, without a traceback. Everything else is a bug and
keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path


class UserError(Exception):
    """Bad input from the user: the message must name the culprit (file, row, key) and say what
    was expected, on one line."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        # Collapse newlines so the CLI contract "one line" holds even for wrapped messages.
        super().__init__(" ".join(message.split("\n")))


class RunFailed(Exception):
    """A run that cannot go on (a worker died, a loss became NaN): one line naming the role and
    the step, exit status 1. Not the user's input, but not a bug to show a traceback for either."""

    exit_code = 1


# ------------------------------------------------------------------------------ OS errors on writes

# errno -> the cause in plain words, shown before the errno name: "disk full (ENOSPC)".
_PLAIN_CAUSES = {
    errno.ENOSPC: "disk full",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.ENOENT: "no such file or folder",
    errno.EEXIST: "already exists",
    errno.EISDIR: "is a folder, expected a file",
    errno.ENOTDIR: "a part of the path is a file, expected a folder",
    errno.ENAMETOOLONG: "file name too long",
    errno.EFBIG: "file too large",
    errno.EIO: "input/output error",
    errno.EMFILE: "too many open files",
}
# Causes that a different path (one the user chose) would fix: a user error, exit status 2. The
# rest (disk full, I/O errors) are the machine's state during a run: exit status 1.
_USER_PATH_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT, errno.EEXIST,
                               errno.EISDIR, errno.ENOTDIR, errno.ENAMETOOLONG})
# Failures that mean "could not write here"; :func:`writing` names its target only for these, so a
# missing input file read inside the block keeps its own message.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM,
                           errno.EIO})
# Libraries that write without Python's OSError (torch.save, safetensors, DCP) still put the C
# library's text in their message; it is the only trace of the errno left.
_STRERROR_TEXT = {code: os.strerror(code) for code in (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES)}


@dataclass(frozen=True)
class OSFailure:
    """An OS-level failure found in an exception: the errno, and the path when one is known."""

    errno: int
    path: str | None

    @property
    def cause(self) -> str:
        """``disk full (ENOSPC)``: the plain words first, the errno name for searching."""
        name = errno.errorcode.get(self.errno, f"errno {self.errno}")
        return f"{_PLAIN_CAUSES.get(self.errno, os.strerror(self.errno).lower())} ({name})"

    @property
    def exit_code(self) -> int:
        return UserError.exit_code if self.errno in _USER_PATH_ERRNOS else RunFailed.exit_code

    def message(self) -> str:
        """One line: ``PATH: disk full (ENOSPC)``; only the cause when the OS named no path
        (callers that know what they were writing use :func:`writing` to name it)."""
        return f"{self.path}: {self.cause}" if self.path else self.cause


def _linked(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, its causes and contexts, and the per-rank failures a torch.distributed.checkpoint
    ``CheckpointException`` carries (rank -> (exception, traceback)); each exception once."""
    seen: set[int] = set()
    stack = [exc]
    while stack:
        current = stack.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        stack.extend(e for e in (current.__context__, current.__cause__) if e is not None)
        failures = getattr(current, "failures", None)  # DCP's CheckpointException
        if isinstance(failures, dict):
            for failure in failures.values():
                inner = failure[0] if isinstance(failure, tuple) and failure else failure
                if isinstance(inner, BaseException):
                    stack.append(inner)


def find_os_failure(exc: BaseException) -> OSFailure | None:
    """The OS failure behind ``exc`` (itself, a cause or context, a DCP rank failure), or None.

    An ``OSError`` with an errno wins; otherwise a message holding the C library's text for
    ENOSPC / EDQUOT / EROFS / EACCES (torch.save and safetensors raise RuntimeError-like errors)."""
    chain = list(_linked(exc))
    for link in chain:
        if isinstance(link, OSError) and link.errno is not None:
            filename = link.filename if isinstance(link.filename, (str, bytes, os.PathLike)) else None
            return OSFailure(link.errno, os.fsdecode(filename) if filename is not None else None)
    for link in chain:
        text = str(link)
        for code, strerror in _STRERROR_TEXT.items():
            if strerror in text or f"os error {code})" in text:
                return OSFailure(code, None)
    return None


# Free space below which a failed write is taken to have filled the disk (see _disk_full).
_FULL_BELOW_BYTES = 64 * 1024


def _disk_full(path: str | os.PathLike[str]) -> bool:
    """True when the file system holding ``path`` (or its nearest existing parent) is full.

    Some writers lose the errno entirely: DCP gathers each rank's exception by pickling it, which
    drops the OSError that torch.save chained to its "unexpected pos" RuntimeError. Right after
    such a failure the partly written file still holds the space, so a full disk is visible."""
    probe = Path(path).absolute()
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        return shutil.disk_usage(probe).free < _FULL_BELOW_BYTES
    except OSError:
        return False


def _write_failure(exc: BaseException, path: str | os.PathLike[str]) -> OSFailure | None:
    """The OS failure behind ``exc`` raised while writing ``path``: found in the exception, or
    inferred from a full disk at ``path`` when the exception lost its errno."""
    failure = find_os_failure(exc)
    if failure is None and _disk_full(path):
        return OSFailure(errno.ENOSPC, None)
    return failure


def _user_path(os_path: str | None, target: str | os.PathLike[str]) -> str:
    """The path to show: the one the OS named, with a hidden scratch sibling of ``target``
    (``.NAME.tmp-*``, ``.NAME.staging``) shown as ``target`` itself, the folder the user chose;
    ``target`` when the OS named none."""
    if os_path is None:
        return os.fspath(target)
    target_abs, failed = Path(target).absolute(), Path(os_path).absolute()
    for folder in (failed, *failed.parents):
        if folder.parent == target_abs.parent and folder.name.startswith(f".{target_abs.name}."):
            return os.fspath(Path(target) / failed.relative_to(folder))
    return os_path


@contextlib.contextmanager
def writing(path: str | os.PathLike[str]) -> Iterator[None]:
    """Turn an OS failure while writing ``path`` into a one-line error naming it: a UserError
    (exit 2) for an unwritable path the user chose, :class:`RunFailed` (exit 1) for a full disk.
    Anything else propagates unchanged (a bug keeps its traceback)."""
    try:
        yield
    except (UserError, RunFailed):
        raise
    except Exception as exc:
        failure = _write_failure(exc, path)
        if failure is None or failure.errno not in _WRITE_ERRNOS:
            raise
        error_type = UserError if failure.exit_code == UserError.exit_code else RunFailed
        raise error_type(f"{_user_path(failure.path, path)}: {failure.cause}") from exc


def portable_os_error(exc: BaseException, path: str | os.PathLike[str]) -> OSError | None:
    """A plain ``OSError(errno, strerror, path)`` for the OS failure behind ``exc``, or None.

    For code whose exceptions cross a process boundary (a Ray worker): Ray pickles an exception
    without its ``__context__``, which is exactly where torch.save and DCP leave the errno, so the
    controller would only see "unexpected pos 704 vs 598". Raise this instead, naming ``path``
    when the OS named no file."""
    failure = _write_failure(exc, path)
    if failure is None:
        return None
    return OSError(failure.errno, os.strerror(failure.errno), failure.path or os.fspath(path))
