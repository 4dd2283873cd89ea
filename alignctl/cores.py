"""How many CPU cores this process may use: the one rule behind every "all the cores" default.

A process held to some of the machine's cores (``taskset``, a container's cpuset, or a pipeline stage that
``alignctl run`` gave a share of the machine: ``cpu_share`` in pipeline files) finds them in its affinity
mask, while ``os.cpu_count()`` counts the whole machine. A leaf: it imports nothing of alignctl.
"""

from __future__ import annotations

import os


def available_core_ids() -> list[int]:
    """The ids of the cores this process may run on (its affinity mask), sorted, at least one."""
    try:
        return sorted(os.sched_getaffinity(0)) or [0]
    except (AttributeError, OSError):  # no affinity masks on this platform (macOS)
        return list(range(os.cpu_count() or 1))


def available_cores() -> int:
    """How many cores this process may run on (its affinity mask), at least 1."""
    return len(available_core_ids())


def pin_to_cores(cores: list[int]) -> None:
    """Hold this process (and the processes it starts from now on) to ``cores``, with as many math threads."""
    os.sched_setaffinity(0, cores)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(len(cores))
    import torch  # after the mask and the variables: its thread pool starts at this size

    torch.set_num_threads(len(cores))
