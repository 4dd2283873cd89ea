"""Worker groups: Ray actors placed in a placement group, forming one torch.distributed group.

A resource pool of ``world_size`` bundles hosts one fused worker process per bundle
(:class:`~alignctl.workers.worker_process.WorkerProcess`). Each process holds the *roles* placed on
that pool (actor+rollout+ref, critic, reward model) as plain Python objects, so roles in one pool
share the process, its device and its process group — the hybrid engine. The controller talks to
a group through three dispatch modes:

- ``broadcast``: every rank runs the call with the same arguments; all results come back;
- ``split``: a :class:`~alignctl.batch.Batch` is cut into ``world_size`` equal parts, rank *i*
  gets part *i*, and the returned Batches are concatenated in rank order;
- ``rank0``: only rank 0 runs the call (saving a model, reading a value).

A failed call fails fast and names the role, the call and where the failing rank ran
(:func:`_get`). A cleanly finished CPU group can be parked for the next run
(:mod:`alignctl.workers.parked_groups`); the Ray session itself is :mod:`alignctl.workers.ray_session`.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from alignctl.batch import Batch
from alignctl.workers import parked_groups
from alignctl.workers.parked_groups import stop_parked
from alignctl.workers.worker_process import DistContext, RoleSpec, WorkerProcess, worker_env

__all__ = ["DistContext", "ResourcePool", "RoleSpec", "WorkerFailed", "WorkerGroup", "claim_parked", "reuse_key"]


@dataclass
class ResourcePool:
    """``world_size`` workers, each with ``cpus`` cores and ``gpus`` GPUs (0 on CPU), on ``nnodes``
    nodes, placed with Ray's ``strategy``."""

    world_size: int
    cpus: int = 1
    gpus: int = 0
    name: str = "global_pool"
    nnodes: int = 1
    strategy: str = "PACK"
    resources: dict[str, float] = field(default_factory=dict)  # custom Ray resources per worker

    def bundles(self) -> list[dict[str, float]]:
        """One node: a bundle per worker (as alignctl always placed them). Several nodes: one bundle
        per node holding that node's workers, so STRICT_SPREAD means "this many distinct nodes,
        world_size / nnodes workers on each" (a bundle per worker cannot say that)."""
        per = self.world_size // self.nnodes if self.nnodes > 1 else 1
        bundle = {"CPU": float(self.cpus * per), **({"GPU": float(self.gpus * per)} if self.gpus else {}),
                  **{name: float(amount * per) for name, amount in self.resources.items()}}
        return [dict(bundle) for _ in range(self.world_size // per)]

    def bundle_of(self, rank: int) -> int:
        return rank // (self.world_size // self.nnodes) if self.nnodes > 1 else rank


# How long a placement group may wait for its resources before the start fails (a pool that cannot
# fit would otherwise wait forever; the fit is checked before, this is the backstop).
PLACEMENT_TIMEOUT_S = 180.0


class WorkerGroup:
    """``world_size`` fused worker processes in one placement group and one process group."""

    def __init__(self, pool: ResourcePool, roles: list[RoleSpec], *, import_paths: list[str] | None = None,
                 warm: WorkerGroup | None = None) -> None:
        """``import_paths``: folders prepended to the workers' Python path (where the controller
        found plugin modules; a worker starts with its working folder and site-packages only).
        ``warm``: a parked group with this group's key (:func:`claim_parked`) whose processes and
        placement group this one takes over; every other parked group is stopped first, so its
        resources are free for this one."""
        self.pool = pool
        self.env = worker_env(import_paths)
        self.key = reuse_key(pool, self.env)
        stop_parked()
        if warm is not None and warm.key == self.key and warm._alive():
            self._pg, self.workers = warm._pg, warm.workers
        else:
            if warm is not None:
                warm.kill(wait=True)  # died while parked: its actors' names must be free for ours
            self._start_processes()
        try:
            self._join_and_build(roles)
        except BaseException:
            self.kill()  # no half-started group keeps its processes (or its actors' names)
            raise

    def _join_and_build(self, roles: list[RoleSpec]) -> None:
        master_addr, master_port = ray.get(self.workers[0].address.remote())
        ray.get([w.init_distributed.remote(master_addr, master_port) for w in self.workers])
        # Where each rank runs, named in failure messages (a dead process can no longer say).
        self.where = [f"node {d['node_ip']} [{d['node_id'][:12]}], pool {self.pool.name} rank {d['rank']}"
                      for d in self.describe()]
        for spec in roles:
            ray.get([w.add_role.remote(spec) for w in self.workers])
        self.role_names = [spec.name for spec in roles]

    def _start_processes(self) -> None:
        pool = self.pool
        self._pg: PlacementGroup = placement_group(pool.bundles(), strategy=pool.strategy, name=pool.name)
        self._wait_placed()
        device = "cuda" if pool.gpus else "cpu"
        remote_cls = ray.remote(WorkerProcess)
        self.workers = [
            remote_cls.options(
                num_cpus=pool.cpus, num_gpus=pool.gpus, resources=dict(pool.resources), name=_actor_name(pool, rank),
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, pool.bundle_of(rank)),
                runtime_env={"env_vars": self.env},
            ).remote(rank, pool.world_size, device, pool.cpus, pool.name)
            for rank in range(pool.world_size)
        ]

    def _wait_placed(self) -> None:
        try:
            ray.get(self._pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except ray.exceptions.GetTimeoutError:
            remove_placement_group(self._pg)
            pool = self.pool
            raise WorkerFailed(f"pool {pool.name!r} ({pool.world_size} workers on {pool.nnodes} node(s), "
                               f"{pool.strategy}) could not be placed within {PLACEMENT_TIMEOUT_S:.0f} s; "
                               f"cluster resources now: {ray.available_resources()}") from None

    @property
    def world_size(self) -> int:
        return self.pool.world_size

    def describe(self) -> list[dict[str, Any]]:
        """Rank, pid, node, pool and roles of every worker (written to the run folder for operators)."""
        return _get([w.describe.remote() for w in self.workers], "group", "describe")

    def spans(self) -> list[tuple[str, str, float, float]]:
        """Every rank's latest role-call intervals (see ``WorkerProcess.spans``)."""
        return [span for rank in _get([w.spans.remote() for w in self.workers], "group", "spans") for span in rank]

    # ------------------------------------------------------------------ dispatch modes

    def broadcast_async(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        return [w.call.remote(role, method, *args, **kwargs) for w in self.workers]

    def broadcast(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.gather(role, method, self.broadcast_async(role, method, *args, **kwargs))

    def split_async(self, role: str, method: str, batch: Batch, **kwargs: Any) -> list[ray.ObjectRef]:
        parts = batch.chunk(self.world_size)
        return [w.call.remote(role, method, part, **kwargs) for w, part in zip(self.workers, parts)]

    def split(self, role: str, method: str, batch: Batch, **kwargs: Any) -> Batch:
        return Batch.concat(self.gather(role, method, self.split_async(role, method, batch, **kwargs)))

    def split_collect(self, role: str, method: str, batch: Batch, **kwargs: Any) -> list[Any]:
        """Split like ``split`` but return every rank's result as is (e.g. metrics dicts)."""
        return self.gather(role, method, self.split_async(role, method, batch, **kwargs))

    def rank0(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.gather(role, method, [self.workers[0].call.remote(role, method, *args, **kwargs)])[0]

    def gather(self, role: str, method: str, refs: list[ray.ObjectRef]) -> list[Any]:
        """Every rank's result of an ``*_async`` call (refs in rank order); a failure names the role,
        the call and where the failing rank ran."""
        return _get(refs, role, method, getattr(self, "where", None))

    def shutdown(self, *, keep_warm: bool = False) -> None:
        """Stop the workers; with ``keep_warm``, a CPU group whose every process ends its run cleanly
        is parked instead, for the next group of the same shape in this process (:func:`claim_parked`)."""
        if keep_warm and self.pool.gpus == 0 and self._release():
            parked_groups.park(self)
            return
        try:
            ray.get([w.shutdown.remote() for w in self.workers], timeout=5)
        except Exception:  # noqa: BLE001 - a dead worker must not block cleanup of the others
            pass
        self.kill()

    def _release(self) -> bool:
        try:
            return all(ray.get([w.release.remote() for w in self.workers], timeout=60))
        except Exception:  # noqa: BLE001 - a worker that cannot release is stopped instead
            return False

    def _alive(self) -> bool:
        try:
            ray.get([w.ping.remote() for w in self.workers], timeout=30)
        except Exception:  # noqa: BLE001 - died while parked (killed, out of memory): start afresh
            return False
        return True

    def kill(self, *, wait: bool = False) -> None:
        """Stop the processes and free the placement group; with ``wait``, return only once the
        workers' actor names are free (up to NAME_RELEASE_TIMEOUT_S), for a group about to reuse them."""
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        with contextlib.suppress(Exception):
            remove_placement_group(self._pg)
        deadline = time.monotonic() + NAME_RELEASE_TIMEOUT_S
        for rank in range(self.world_size) if wait else ():
            while time.monotonic() < deadline:
                try:
                    ray.get_actor(_actor_name(self.pool, rank))
                except ValueError:
                    break
                time.sleep(0.05)


def _actor_name(pool: ResourcePool, rank: int) -> str:
    return f"{pool.name}-rank{rank}"


# How long to wait for a stopped worker's actor name to be free again.
NAME_RELEASE_TIMEOUT_S = 30.0


def reuse_key(pool: ResourcePool, env: dict[str, str]) -> tuple[Any, ...]:
    """What a parked group must match to be taken over: this Ray session and driver, the pool's
    whole shape, and the workers' environment."""
    return (*parked_groups.ray_session_id(), pool.world_size, pool.cpus, pool.gpus, pool.name,
            pool.nnodes, pool.strategy, tuple(sorted(pool.resources.items())), tuple(sorted(env.items())))


def claim_parked(pools: dict[str, tuple[ResourcePool, list[str] | None]]) -> dict[str, WorkerGroup]:
    """Take the parked groups that match these pools (name -> (pool, import paths)) off the parked
    list, for the groups about to start; the rest stay parked until :func:`stop_parked`."""
    if not ray.is_initialized():
        return {}
    return parked_groups.claim({name: reuse_key(pool, worker_env(paths)) for name, (pool, paths) in pools.items()})


class WorkerFailed(Exception):
    """A worker process died, or raised, during a role call."""


def _get(refs: list[Any], role: str, method: str, where: list[str] | None = None) -> Any:
    """``ray.get`` that names the role and call (and, with ``where``, the failing rank's node and
    pool; one entry per ref) when a worker dies or a role method raises."""
    # Wait on whichever finishes first: when one rank dies, its peers may be blocked in a
    # collective with it forever, so waiting on rank 0 first could hang instead of failing.
    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        try:
            ray.get(ready)  # raises at once for a dead or failed worker
        except ray.exceptions.RayActorError as exc:
            raise WorkerFailed(_died(role, method, exc, where, refs.index(ready[0]))) from exc
        except ray.exceptions.RayTaskError as exc:
            _raise_if_a_peer_died(refs, role, method, where)
            raise _failed(role, method, exc) from exc
    return ray.get(refs)


def _died(role: str, method: str, exc: Exception, where: list[str] | None, index: int) -> str:
    place = f" on {where[index]}" if where and index < len(where) else ""
    return f"a '{role}' worker process died during {method}{place} ({type(exc).__name__})"


def _failed(role: str, method: str, exc: ray.exceptions.RayTaskError) -> WorkerFailed:
    cause = exc.cause if exc.cause is not None else exc
    # A full disk or unwritable folder (e.g. while saving a checkpoint) is named in plain
    # words with its path, not as the library's wrapper (DCP's CheckpointException, ...).
    from alignctl.errors import find_os_failure

    failure = find_os_failure(cause)
    if failure is not None:
        return WorkerFailed(f"'{role}' worker failed in {method}: {failure.message()}")
    return WorkerFailed(f"'{role}' worker failed in {method}: {type(cause).__name__}: "
                        f"{str(cause).splitlines()[0] if str(cause) else ''}")


# How long to look for a dead peer behind a rank's error before reporting the error itself.
PEER_DEATH_GRACE_S = 5.0


def _raise_if_a_peer_died(refs: list[Any], role: str, method: str, where: list[str] | None) -> None:
    """A rank whose collective peer was killed fails with a transport error ("connection reset")
    that may arrive before Ray reports the death: name the root cause, the dead process."""
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=PEER_DEATH_GRACE_S)
    for ref in done:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise WorkerFailed(_died(role, method, exc, where, refs.index(ref))) from exc
        except ray.exceptions.RayTaskError:
            continue
