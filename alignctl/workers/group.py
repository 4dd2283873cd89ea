"""Worker groups: Ray actors placed in a placement group, forming one torch.distributed group.

A resource pool of ``world_size`` bundles hosts one fused worker process per bundle. Each process
holds the *roles* placed on that pool (actor+rollout+ref, critic, reward model) as plain Python
objects, so roles in one pool share the process, its device and its process group — the hybrid
engine. The controller talks to a group through three dispatch modes:

- ``broadcast``: every rank runs the call with the same arguments; all results come back;
- ``split``: a :class:`~alignctl.batch.Batch` is cut into ``world_size`` equal parts, rank *i*
  gets part *i*, and the returned Batches are concatenated in rank order;
- ``rank0``: only rank 0 runs the call (saving a model, reading a value).
"""

from __future__ import annotations

import importlib
import os
import socket
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from alignctl.batch import Batch


@dataclass
class RoleSpec:
    """A role to build inside each worker: ``factory`` is "module:callable", called with
    ``(ctx, **kwargs)`` where ctx is the worker's :class:`DistContext`."""

    name: str
    factory: str
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass
class DistContext:
    rank: int
    world_size: int
    device: str
    backend: str


# DeepSpeed (imported by transformers when installed) prints an accelerator banner without this.
WORKER_ENV = {"DS_ACCELERATOR_LOG_LEVEL": "error", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


class _Worker:
    """The body of one fused worker process (wrapped by ``ray.remote`` in :class:`WorkerGroup`)."""

    def __init__(self, rank: int, world_size: int, device: str, threads: int) -> None:
        self.rank, self.world_size, self.device, self.threads = rank, world_size, device, threads
        self.roles: dict[str, Any] = {}
        _quiet_libraries()

    def address(self) -> tuple[str, int]:
        return ray.util.get_node_ip_address(), _free_port()

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "node_ip": ray.util.get_node_ip_address(),
                "device": self.device, "roles": sorted(self.roles)}

    def init_distributed(self, master_addr: str, master_port: int) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(self.threads)
        backend = "nccl" if self.device == "cuda" else "gloo"
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this bundle's GPU
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")
        dist.init_process_group(backend, init_method=f"tcp://{master_addr}:{master_port}",
                                rank=self.rank, world_size=self.world_size)
        self.ctx = DistContext(self.rank, self.world_size, self.device, backend)

    def add_role(self, spec: RoleSpec) -> None:
        module, name = spec.factory.split(":")
        factory = getattr(importlib.import_module(module), name)
        self.roles[spec.name] = factory(self.ctx, **spec.kwargs)

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.roles[role], method)(*args, **kwargs)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _quiet_libraries() -> None:
    """Worker logs reach the user's console through Ray: keep only warnings that matter."""
    import warnings

    import transformers

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")


@dataclass
class ResourcePool:
    """``world_size`` workers, each with ``cpus`` cores and ``gpus`` GPUs (0 on CPU)."""

    world_size: int
    cpus: int = 1
    gpus: int = 0
    name: str = "global_pool"


class WorkerGroup:
    """``world_size`` fused worker processes in one placement group and one process group."""

    def __init__(self, pool: ResourcePool, roles: list[RoleSpec]) -> None:
        self.pool = pool
        bundle = {"CPU": pool.cpus, **({"GPU": pool.gpus} if pool.gpus else {})}
        self._pg: PlacementGroup = placement_group([dict(bundle) for _ in range(pool.world_size)],
                                                   strategy="PACK", name=pool.name)
        ray.get(self._pg.ready())
        device = "cuda" if pool.gpus else "cpu"
        remote_cls = ray.remote(_Worker)
        self.workers = [
            remote_cls.options(
                num_cpus=pool.cpus, num_gpus=pool.gpus, name=f"{pool.name}-rank{rank}",
                scheduling_strategy=PlacementGroupSchedulingStrategy(self._pg, rank),
                runtime_env={"env_vars": WORKER_ENV},
            ).remote(rank, pool.world_size, device, pool.cpus)
            for rank in range(pool.world_size)
        ]
        master_addr, master_port = ray.get(self.workers[0].address.remote())
        ray.get([w.init_distributed.remote(master_addr, master_port) for w in self.workers])
        for spec in roles:
            ray.get([w.add_role.remote(spec) for w in self.workers])
        self.role_names = [spec.name for spec in roles]

    @property
    def world_size(self) -> int:
        return self.pool.world_size

    def describe(self) -> list[dict[str, Any]]:
        """Rank, pid, node and roles of every worker (written to the run folder for operators)."""
        return _get([w.describe.remote() for w in self.workers], "group", "describe")

    # ------------------------------------------------------------------ dispatch modes

    def broadcast_async(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[ray.ObjectRef]:
        return [w.call.remote(role, method, *args, **kwargs) for w in self.workers]

    def broadcast(self, role: str, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return _get(self.broadcast_async(role, method, *args, **kwargs), role, method)

    def split_async(self, role: str, method: str, batch: Batch, **kwargs: Any) -> list[ray.ObjectRef]:
        parts = batch.chunk(self.world_size)
        return [w.call.remote(role, method, part, **kwargs) for w, part in zip(self.workers, parts)]

    def split(self, role: str, method: str, batch: Batch, **kwargs: Any) -> Batch:
        return Batch.concat(_get(self.split_async(role, method, batch, **kwargs), role, method))

    def split_collect(self, role: str, method: str, batch: Batch, **kwargs: Any) -> list[Any]:
        """Split like ``split`` but return every rank's result as is (e.g. metrics dicts)."""
        return _get(self.split_async(role, method, batch, **kwargs), role, method)

    def rank0(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        return _get(self.workers[0].call.remote(role, method, *args, **kwargs), role, method)

    def shutdown(self) -> None:
        try:
            ray.get([w.shutdown.remote() for w in self.workers], timeout=5)
        except Exception:  # noqa: BLE001 - a dead worker must not block cleanup of the others
            pass
        for worker in self.workers:
            ray.kill(worker)
        remove_placement_group(self._pg)


class WorkerFailed(Exception):
    """A worker process died, or raised, during a role call."""


def _get(refs: Any, role: str, method: str) -> Any:
    """``ray.get`` that names the role and call when a worker dies or a role method raises."""
    try:
        if not isinstance(refs, list):
            return ray.get(refs)
        # Wait on whichever finishes first: when one rank dies, its peers may be blocked in a
        # collective with it forever, so waiting on rank 0 first could hang instead of failing.
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            ray.get(ready)  # raises at once for a dead or failed worker
        return ray.get(refs)
    except ray.exceptions.RayActorError as exc:
        raise WorkerFailed(f"a '{role}' worker process died during {method} ({type(exc).__name__})") from exc
    except ray.exceptions.RayTaskError as exc:
        if isinstance(refs, list):
            _raise_if_a_peer_died(refs, role, method)
        cause = exc.cause if exc.cause is not None else exc
        raise WorkerFailed(f"'{role}' worker failed in {method}: {type(cause).__name__}: "
                           f"{str(cause).splitlines()[0] if str(cause) else ''}") from exc


# How long to look for a dead peer behind a rank's error before reporting the error itself.
PEER_DEATH_GRACE_S = 5.0


def _raise_if_a_peer_died(refs: list[Any], role: str, method: str) -> None:
    """A rank whose collective peer was killed fails with a transport error ("connection reset")
    that may arrive before Ray reports the death: name the root cause, the dead process."""
    done, _ = ray.wait(refs, num_returns=len(refs), timeout=PEER_DEATH_GRACE_S)
    for ref in done:
        try:
            ray.get(ref)
        except ray.exceptions.RayActorError as exc:
            raise WorkerFailed(f"a '{role}' worker process died during {method} ({type(exc).__name__})") from exc
        except ray.exceptions.RayTaskError:
            continue


def init_ray(address: str | None, num_cpus: int | None = None) -> None:
    """Connect to a cluster (``address``) or start a small local one, quietly."""
    if ray.is_initialized():
        return
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    ray.init(num_cpus=num_cpus, include_dashboard=False, log_to_driver=True,
             object_store_memory=512 * 1024 * 1024, configure_logging=True, logging_level="ERROR")
