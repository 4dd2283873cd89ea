"""Parked worker groups: a cleanly finished CPU run's processes, kept for the next run of the same shape.

Starting a worker process costs ~10 s of CPU before it does any work (importing torch and
transformers, joining Ray). A run that ends cleanly on CPU workers parks its group: the processes
stay up with no roles, no process group and their freed heap returned, holding their placement
group, and the next run in this driver process whose pool has the same shape, threads and
environment takes them over (a pipeline's GRPO then PPO stage, a sweep through the Python API, the
test suite). Roles are built afresh each run, seeded as always; GPU groups are never parked (their
device memory must be free for whatever runs next). trainer.reuse_workers: false turns it off.

A group is matched by its ``key`` (``WorkerGroup.key``: this Ray session and driver, the pool's
whole shape and the workers' environment); this module keeps the list and knows groups only
through that key, their ``workers`` and ``kill``.
"""

from __future__ import annotations

from typing import Any, Protocol

import ray

from alignctl.workers.ray_session import at_shutdown


class Parkable(Protocol):
    key: tuple[Any, ...]
    workers: list[Any]

    def kill(self, *, wait: bool = False) -> None: ...


_PARKED: list[Parkable] = []
at_shutdown(_PARKED.clear)  # Ray stops their processes


def ray_session_id() -> tuple[str, str]:
    """This driver's Ray session and job: the first two entries of every group key."""
    context = ray.get_runtime_context()
    return context.get_session_name(), context.get_job_id()


def park(group: Parkable) -> None:
    _PARKED.append(group)


def claim(keys: dict[str, tuple[Any, ...]]) -> dict[str, Any]:
    """Take the parked groups whose key matches (name -> key) off the parked list, one per name;
    the rest stay parked until :func:`stop_parked`."""
    claimed: dict[str, Any] = {}
    if not _PARKED or not ray.is_initialized():
        return claimed
    for name, key in keys.items():
        for group in _PARKED:
            if group.key == key:
                _PARKED.remove(group)
                claimed[name] = group
                break
    return claimed


def _parked_in_this_session() -> list[Parkable]:
    """The parked groups of the Ray session this driver is connected to (one parked in an earlier
    session went with that session)."""
    if not ray.is_initialized():
        return []
    session = ray_session_id()
    return [group for group in _PARKED if group.key[:2] == session]


def stop_parked() -> None:
    """Stop every parked group (their processes and placement groups) and wait until their workers'
    actor names are free: a group started next may use the same pool name."""
    alive = _parked_in_this_session()
    _PARKED.clear()
    for group in alive:
        group.kill(wait=True)


def parked_pids() -> list[int]:
    """The process ids of the workers parked in this Ray session (for tests and the curious)."""
    return [pid for group in _parked_in_this_session() for pid in ray.get([w.ping.remote() for w in group.workers])]
