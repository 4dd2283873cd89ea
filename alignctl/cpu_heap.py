"""Keep freed C-heap memory for reuse in processes that compute on the CPU.

glibc's malloc serves every block above its mmap threshold (32 MiB at most) with a fresh ``mmap`` and
unmaps it on ``free``. A CPU training step allocates several such blocks (one micro-batch's logits
are tokens x vocabulary x 4 bytes: 120 MB for 610 tokens of SmolLM2) and frees them at its end, so
the next step maps them again and the kernel zero-fills every page on first touch: 300k-500k page
faults per actor update of the quickstart, about a fifth of its time (measured: 4.2 s -> 3.4 s).
:func:`keep_freed_memory` turns that off with ``mallopt``: large blocks come from the heap and freed
heap memory stays mapped, so later steps reuse the same pages. The arithmetic is unchanged (PyTorch
aligns its CPU buffers to 64 bytes either way), only the page faults go.

The cost is memory: a process keeps its heap at its peak until it exits, plus the freed blocks no
later request fits (an 8-layer SmolLM2-shaped training loop stayed at 2.4-2.5 GB resident against
1.5-1.6 GB, flat after its first steps). That suits a CPU training process (the heap is its working
memory), not a GPU run (its CPU side holds a checkpoint once, then little), so callers apply it only
where the compute device is the CPU. Glibc only: on other C libraries (musl, macOS) it does nothing.
``ALIGNCTL_CPU_HEAP=system`` keeps glibc's defaults (``keep``, the default, is the setting above); any
other value is a one-line error (the CLI checks it before any stage starts).

A leaf: imports only ``errors``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

from alignctl.errors import UserError

__all__ = ["ENV_VAR", "keep_freed_memory", "kept", "return_freed_memory", "setting"]

ENV_VAR = "ALIGNCTL_CPU_HEAP"

# mallopt parameter numbers from glibc's <malloc.h>.
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4
# Free memory at the top of the heap above this many bytes goes back to the system; mallopt takes an
# int, so 2 GiB is the most it can be: far above what one step of the models that train on a CPU frees.
_TRIM_THRESHOLD = 2**31 - 1

_applied = False


def _glibc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.gnu_get_libc_version  # only glibc has it (and mallopt with these numbers)
    except (OSError, AttributeError):
        return None
    return libc


def setting() -> str:
    """``keep`` (the default) or ``system``, from ``ALIGNCTL_CPU_HEAP``; another value is a UserError."""
    value = os.environ.get(ENV_VAR, "").strip().lower() or "keep"
    if value not in ("keep", "system"):
        raise UserError(f"environment variable {ENV_VAR}={value!r}: expected 'keep' (the default) or 'system'")
    return value


def kept() -> bool:
    """Whether :func:`keep_freed_memory` took effect in this process."""
    return _applied


def keep_freed_memory() -> bool:
    """Serve large blocks from the heap and never trim it, for this process (idempotent).

    Returns whether the setting is in effect: False off glibc, or with ``ALIGNCTL_CPU_HEAP=system``.
    """
    global _applied
    if _applied:
        return True
    if setting() == "system":
        return False
    libc = _glibc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    libc.mallopt.restype = ctypes.c_int
    _applied = bool(libc.mallopt(_M_MMAP_MAX, 0)) and bool(libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))
    return _applied


def return_freed_memory() -> bool:
    """Give the heap's free pages back to the system now (glibc's ``malloc_trim(0)``), whatever the
    trim threshold: for a process that stays alive idle after its work (a parked Ray worker), whose
    heap would otherwise stay at its peak. Returns whether anything was released; False off glibc."""
    libc = _glibc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    libc.malloc_trim.restype = ctypes.c_int
    return bool(libc.malloc_trim(0))
