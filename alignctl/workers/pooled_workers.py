"""Roles on named resource pools: one :class:`WorkerGroup` per pool (its own placement group and
torch.distributed group) and a router that sends each call to the group holding its role, so the
controller keeps one loop whatever the placement (``trainer.pools`` / ``trainer.placement``).

Concurrency needs no scheduler: Ray actor calls are asynchronous, so ``run_calls`` submits the
independent calls of one phase before waiting on any. Calls of roles in different pools then run at
the same time; calls of roles sharing a pool queue on the same processes and run in submission
order, exactly as when they were issued one by one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray

from alignctl.batch import Batch
from alignctl.errors import UserError
from alignctl.workers.group import ResourcePool, RoleSpec, WorkerGroup, claim_parked


class PooledWorkers:
    """The worker groups of a run, addressed by role; the same dispatch methods as a WorkerGroup."""

    def __init__(self, groups: dict[str, WorkerGroup], placement: dict[str, str]) -> None:
        self.groups, self.placement = groups, placement

    def pool_of(self, role: str) -> str:
        return self.placement[role]

    def group(self, role: str) -> WorkerGroup:
        return self.groups[self.placement[role]]

    @property
    def world_size(self) -> int:
        """The actor pool's workers: what the controller splits generation and batches over."""
        return self.group("actor").world_size

    def world_size_of(self, role: str) -> int:
        return self.group(role).world_size

    @property
    def total_workers(self) -> int:
        return sum(g.world_size for g in self.groups.values())

    def describe(self) -> list[dict[str, Any]]:
        return [row for group in self.groups.values() for row in group.describe()]

    def spans(self) -> dict[str, list[tuple[str, str, float, float]]]:
        """Each pool's latest role-call intervals (wall clock, every rank)."""
        return {name: group.spans() for name, group in self.groups.items()}

    def broadcast_async(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        return self.group(role).broadcast_async(role, method, *args, **kwargs)

    def broadcast(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return self.group(role).broadcast(role, method, *args, **kwargs)

    def split_async(self, role: str, method: str, batch: Batch, **kwargs: Any) -> list[ray.ObjectRef]:
        return self.group(role).split_async(role, method, batch, **kwargs)

    def split(self, role: str, method: str, batch: Batch, **kwargs: Any) -> Batch:
        return self.group(role).split(role, method, batch, **kwargs)

    def split_collect(self, role: str, method: str, batch: Batch, **kwargs: Any) -> list[Any]:
        return self.group(role).split_collect(role, method, batch, **kwargs)

    def rank0(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return self.group(role).rank0(role, method, *args, **kwargs)

    def gather(self, role: str, method: str, refs: list[ray.ObjectRef]) -> list[Any]:
        return self.group(role).gather(role, method, refs)

    def shutdown(self, *, keep_warm: bool = False) -> None:
        """Stop every group; ``keep_warm`` parks the groups that can be for the next run (WorkerGroup.shutdown)."""
        for group in self.groups.values():
            group.shutdown(keep_warm=keep_warm)


def start_pools(pools: dict[str, ResourcePool], roles: dict[str, RoleSpec], placement: dict[str, str],
                import_paths: list[str] | None = None, *, reuse: bool = True) -> PooledWorkers:
    """One WorkerGroup per pool with the roles placed on it (in the order of ``roles``); a failed
    start stops the groups already started. With ``reuse``, a pool takes over a parked group of its
    shape (``WorkerGroup``'s ``warm``); without, every parked group is stopped and all start afresh."""
    groups: dict[str, WorkerGroup] = {}
    warm = claim_parked({name: (pool, import_paths) for name, pool in pools.items()}) if reuse else {}
    try:
        for name, pool in pools.items():
            specs = [spec for role, spec in roles.items() if placement[role] == name]
            groups[name] = WorkerGroup(pool, specs, import_paths=import_paths, warm=warm.pop(name, None))
    except BaseException:
        for group in [*groups.values(), *warm.values()]:
            group.shutdown()
        raise
    return PooledWorkers(groups, placement)


# ---------------------------------------------------------------------------------- phases


@dataclass
class Call:
    """One split call of a phase: ``name`` is its timing key; ``collect`` returns every rank's
    result as is (metrics) instead of concatenating Batches."""

    name: str
    role: str
    method: str
    batch: Batch
    collect: bool = False


def run_calls(workers: Any, calls: Sequence[Call], *, concurrent: bool = True) -> tuple[list[Any], dict[str, float]]:
    """Results of ``calls`` (in order) and each call's seconds. With ``concurrent`` and more than
    one pool involved, every call is submitted before any is awaited; otherwise one by one."""
    pools = {_pool(workers, c.role) for c in calls}
    if not concurrent or len(pools) < 2:
        results, seconds = [], {}
        for call in calls:
            start = time.perf_counter()
            results.append(_result(call, workers.gather(call.role, call.method, _submit(workers, call))))
            seconds[call.name] = time.perf_counter() - start
        return results, seconds
    start = time.perf_counter()
    refs = [_submit(workers, call) for call in calls]
    done_at = _wait_all(workers, calls, refs)
    results = [_result(c, workers.gather(c.role, c.method, r)) for c, r in zip(calls, refs)]
    return results, _own_seconds(workers, calls, start, done_at)


def _pool(workers: Any, role: str) -> str:
    return workers.pool_of(role) if hasattr(workers, "pool_of") else "global_pool"


def _submit(workers: Any, call: Call) -> list[ray.ObjectRef]:
    return workers.split_async(call.role, call.method, call.batch)


def _result(call: Call, parts: list[Any]) -> Any:
    return parts if call.collect else Batch.concat(parts)


def _wait_all(workers: Any, calls: Sequence[Call], refs: list[list[ray.ObjectRef]]) -> list[float]:
    """When each call's last rank finished. A failed rank ends the wait at once (its peers may be
    stuck in a collective with it): ``gather`` of its call then raises, naming role and node."""
    owner = {ref: i for i, rank_refs in enumerate(refs) for ref in rank_refs}
    left = [len(r) for r in refs]
    done_at = [0.0] * len(calls)
    pending = list(owner)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        i = owner[ready[0]]
        try:
            ray.get(ready[0])
        except Exception:  # noqa: BLE001 - gather turns it into the one-line WorkerFailed
            workers.gather(calls[i].role, calls[i].method, refs[i])
            raise
        left[i] -= 1
        if not left[i]:
            done_at[i] = time.perf_counter()
    return done_at


def _own_seconds(workers: Any, calls: Sequence[Call], start: float, done_at: list[float]) -> dict[str, float]:
    """A call's time from when its pool was free for it (calls of one pool run one after another)
    to when it finished, so a queued call is not charged for the one before it."""
    free = {}
    seconds = {}
    for call, done in zip(calls, done_at):
        pool = _pool(workers, call.role)
        seconds[call.name] = done - max(start, free.get(pool, start))
        free[pool] = done
    return seconds


# ---------------------------------------------------------------------------------- fit


def check_fit(pools: dict[str, ResourcePool], nodes: list[dict[str, float]], keys: dict[str, str],
              where: str) -> None:
    """Refuse, before any worker starts, pools that cannot all be placed on ``nodes`` (each node's
    total resources). Necessary conditions only, never a false refusal: every bundle fits on some
    node, STRICT_SPREAD bundles find as many distinct nodes, STRICT_PACK fits one node, and the
    pools together fit the cluster."""
    for name, pool in pools.items():
        bundles = pool.bundles()
        fitting = [n for n in nodes if _fits(bundles[0], n)]
        needed = {"STRICT_SPREAD": len(bundles)}.get(pool.strategy, 1)
        if pool.strategy == "STRICT_PACK":
            fitting = [n for n in nodes if _fits(_total(bundles), n)]
        if len(fitting) < needed:
            raise UserError(f"key {keys[name]!r}: pool {name!r} needs {_describe(pool)}; {where} has "
                            f"{_nodes_text(nodes)}")
    need = _total([b for pool in pools.values() for b in pool.bundles()])
    have = _total(nodes)
    short = [r for r, amount in need.items() if amount > have.get(r, 0.0)]
    if short:
        listing = ", ".join(f"{name}: {_describe(pool)}" for name, pool in pools.items())
        raise UserError(f"key 'trainer.pools': the pools together need {_amounts(need)} ({listing}); {where} "
                        f"has {_amounts(have)} in all")


def _fits(bundle: dict[str, float], node: dict[str, float]) -> bool:
    return all(node.get(r, 0.0) >= amount for r, amount in bundle.items())


def _total(items: list[dict[str, float]]) -> dict[str, float]:
    total: dict[str, float] = {}
    for item in items:
        for r, amount in item.items():
            if r in ("CPU", "GPU"):
                total[r] = total.get(r, 0.0) + amount
    return total


def _amounts(resources: dict[str, float]) -> str:
    return " + ".join(f"{amount:g} {r}" for r, amount in sorted(resources.items())) or "nothing"


def _describe(pool: ResourcePool) -> str:
    gpus = f" + {pool.gpus} GPU" if pool.gpus else ""
    return (f"{pool.world_size} workers x ({pool.cpus} CPU{gpus}) on {pool.nnodes} node(s), "
            f"{pool.strategy}")


def _nodes_text(nodes: list[dict[str, float]]) -> str:
    return f"{len(nodes)} node(s): " + "; ".join(_amounts(_total([n])) for n in nodes)


def cluster_nodes() -> list[dict[str, float]]:
    """Total resources of each live node of the cluster this driver is connected to."""
    return [dict(node["Resources"]) for node in ray.nodes() if node.get("Alive")]
