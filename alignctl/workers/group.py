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

import atexit
import contextlib
import importlib
import ipaddress
import os
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import ray
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from alignctl import cpu_heap
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


MAX_SPANS = 256  # role-call intervals a worker keeps for spans()

# DeepSpeed (imported by transformers when installed) prints an accelerator banner without this.
WORKER_ENV = {"DS_ACCELERATOR_LOG_LEVEL": "error", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


LOOPBACK = "127.0.0.1"
# Rendezvous timeout, as torch's default for a tcp:// init_method (slow model loads on busy hosts).
STORE_TIMEOUT = timedelta(minutes=30)


def _listening_socket(ip: str) -> socket.socket:
    """A socket listening on ``ip`` only (never 0.0.0.0), on a port the kernel picks."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((ip, 0))
    sock.listen(128)
    return sock


def _is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


def _loopback_interface() -> str:
    return "lo0" if sys.platform == "darwin" else "lo"


class _Worker:
    """The body of one fused worker process (wrapped by ``ray.remote`` in :class:`WorkerGroup`)."""

    def __init__(self, rank: int, world_size: int, device: str, threads: int, pool: str = "global_pool") -> None:
        self.rank, self.world_size, self.device, self.threads, self.pool = rank, world_size, device, threads, pool
        self.roles: dict[str, Any] = {}
        self._spans: list[tuple[str, str, float, float]] = []  # (role, method, start, end): see spans()
        self._store_socket: socket.socket | None = None  # rank 0's rendezvous listener, see address()
        _quiet_libraries()

    def address(self) -> tuple[str, int]:
        """Rank 0's rendezvous address: a socket listening on this node's Ray IP (127.0.0.1 for a
        local run, the node's own IP on a cluster), held open until ``init_distributed`` hands it to
        the TCP store: torch's own store would listen on every interface, and a port picked then
        closed could be taken by another process in between."""
        ip = ray.util.get_node_ip_address()
        self._store_socket = _listening_socket(ip)
        return ip, int(self._store_socket.getsockname()[1])

    def describe(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "node_ip": ray.util.get_node_ip_address(),
                "node_id": ray.get_runtime_context().get_node_id(), "pool": self.pool,
                "device": self.device, "heap_kept": cpu_heap.kept(), "roles": sorted(self.roles)}

    def init_distributed(self, master_addr: str, master_port: int) -> None:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(self.threads)
        # On a CPU the steps' large buffers reuse the same pages (alignctl.cpu_heap).
        if self.device == "cpu":
            cpu_heap.keep_freed_memory()
        backend = "nccl" if self.device == "cuda" else "gloo"
        if self.device == "cuda":
            torch.cuda.set_device(0)  # Ray sets CUDA_VISIBLE_DEVICES to this bundle's GPU
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")
        if _is_loopback(master_addr):
            # Every rank is on this machine: gloo's pair sockets and NCCL's bootstrap listen on the
            # interface the host name resolves to (often the LAN), so pin them to loopback; a
            # value the user set is kept.
            os.environ.setdefault("GLOO_SOCKET_IFNAME", _loopback_interface())
            os.environ.setdefault("NCCL_SOCKET_IFNAME", _loopback_interface())
        dist.init_process_group(backend, store=self._store(master_addr, master_port),
                                rank=self.rank, world_size=self.world_size)
        self.ctx = DistContext(self.rank, self.world_size, self.device, backend)

    def _store(self, master_addr: str, master_port: int) -> Any:
        """The rendezvous store; rank 0 serves it on the socket ``address`` bound (its fd goes to
        the store, which owns it from then on)."""
        import torch.distributed as dist

        if self.rank != 0:
            return dist.TCPStore(master_addr, master_port, self.world_size, is_master=False, timeout=STORE_TIMEOUT)
        sock = self._store_socket
        if sock is None:  # ``address`` was not asked: serve on the address given, not on every interface
            sock = socket.create_server((master_addr, master_port),
                                        family=socket.AF_INET6 if ":" in master_addr else socket.AF_INET)
        self._store_socket = None
        return dist.TCPStore(master_addr, master_port, self.world_size, is_master=True,
                             master_listen_fd=sock.detach(), timeout=STORE_TIMEOUT)

    def add_role(self, spec: RoleSpec) -> None:
        module, name = spec.factory.split(":")
        factory = getattr(importlib.import_module(module), name)
        self.roles[spec.name] = factory(self.ctx, **spec.kwargs)

    def call(self, role: str, method: str, *args: Any, **kwargs: Any) -> Any:
        start = time.time()
        try:
            return getattr(self.roles[role], method)(*args, **kwargs)
        finally:
            self._spans = [*self._spans[-(MAX_SPANS - 1):], (role, method, start, time.time())]

    def spans(self) -> list[tuple[str, str, float, float]]:
        """The wall-clock intervals of the latest role calls (oldest first), then forgets them: how
        a benchmark sees which phases of different pools overlapped."""
        spans, self._spans = self._spans, []
        return spans

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()

    def ping(self) -> int:
        return os.getpid()

    def release(self) -> bool:
        """End the run in this process but keep the process for the next one
        (``WorkerGroup.shutdown(keep_warm=True)``): leave the process group, drop the roles (models, optimizers, engines) and
        give their freed heap back to the system. Returns whether the process is fit to host
        another run: not after DeepSpeed set up its communication backend, a process-wide global
        it never tears down."""
        import gc

        self.shutdown()
        self.roles.clear()
        self._spans = []
        gc.collect()
        cpu_heap.return_freed_memory()
        deepspeed_comm = sys.modules.get("deepspeed.comm.comm")
        return getattr(deepspeed_comm, "cdb", None) is None


def _quiet_libraries() -> None:
    """Worker logs reach the user's console through Ray: keep only warnings that matter."""
    import warnings

    import transformers

    from alignctl.quiet import filter_deepspeed_cpu_notice

    transformers.utils.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message=".*returned a view tensor.*")
    filter_deepspeed_cpu_notice()  # saving a checkpoint imports DeepSpeed in the worker


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
                warm._kill(wait=True)  # died while parked: its actors' names must be free for ours
            self._start_processes()
        try:
            self._join_and_build(roles)
        except BaseException:
            self._kill()  # no half-started group keeps its processes (or its actors' names)
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
        remote_cls = ray.remote(_Worker)
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
        """Every rank's latest role-call intervals (see ``_Worker.spans``)."""
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
            _PARKED.append(self)
            return
        try:
            ray.get([w.shutdown.remote() for w in self.workers], timeout=5)
        except Exception:  # noqa: BLE001 - a dead worker must not block cleanup of the others
            pass
        self._kill()

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

    def _kill(self, *, wait: bool = False) -> None:
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


# ------------------------------------------------------------------ parked groups
#
# Starting a worker process costs ~10 s of CPU before it does any work (importing torch and
# transformers, joining Ray). A run that ends cleanly on CPU workers parks its group: the processes
# stay up with no roles, no process group and their freed heap returned, holding their placement
# group, and the next run in this driver process whose pool has the same shape, threads and
# environment takes them over (a pipeline's GRPO then PPO stage, a sweep through the Python API, the
# test suite). Roles are built afresh each run, seeded as always; GPU groups are never parked (their
# device memory must be free for whatever runs next). trainer.reuse_workers: false turns it off.

_PARKED: list[WorkerGroup] = []


def worker_env(import_paths: list[str] | None = None) -> dict[str, str]:
    """The environment variables a group's workers start with."""
    env = dict(WORKER_ENV)
    if cpu_heap.ENV_VAR in os.environ:  # the user's choice reaches workers on other nodes too
        env[cpu_heap.ENV_VAR] = os.environ[cpu_heap.ENV_VAR]
    if import_paths:
        env["PYTHONPATH"] = os.pathsep.join([*import_paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def reuse_key(pool: ResourcePool, env: dict[str, str]) -> tuple[Any, ...]:
    """What a parked group must match to be taken over: this Ray session and driver, the pool's
    whole shape, and the workers' environment."""
    return (*_session(), pool.world_size, pool.cpus, pool.gpus, pool.name,
            pool.nnodes, pool.strategy, tuple(sorted(pool.resources.items())), tuple(sorted(env.items())))


def _session() -> tuple[str, str]:
    context = ray.get_runtime_context()
    return context.get_session_name(), context.get_job_id()


def claim_parked(pools: dict[str, tuple[ResourcePool, list[str] | None]]) -> dict[str, WorkerGroup]:
    """Take the parked groups that match these pools (name -> (pool, import paths)) off the parked
    list, for the groups about to start; the rest stay parked until :func:`stop_parked`."""
    claimed: dict[str, WorkerGroup] = {}
    if not _PARKED or not ray.is_initialized():
        return claimed
    for name, (pool, import_paths) in pools.items():
        key = reuse_key(pool, worker_env(import_paths))
        for group in _PARKED:
            if group.key == key:
                _PARKED.remove(group)
                claimed[name] = group
                break
    return claimed


def _parked_in_this_session() -> list[WorkerGroup]:
    """The parked groups of the Ray session this driver is connected to (one parked in an earlier
    session went with that session)."""
    if not ray.is_initialized():
        return []
    session = _session()
    return [group for group in _PARKED if group.key[:2] == session]


def stop_parked() -> None:
    """Stop every parked group (their processes and placement groups) and wait until their workers'
    actor names are free: a group started next may use the same pool name."""
    alive = _parked_in_this_session()
    _PARKED.clear()
    for group in alive:
        group._kill(wait=True)


def parked_pids() -> list[int]:
    """The process ids of the workers parked in this Ray session (for tests and the curious)."""
    return [pid for group in _parked_in_this_session() for pid in ray.get([w.ping.remote() for w in group.workers])]


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


# Session folders (<ray temp dir>/session_*) of the local clusters this process started; removed
# when Ray is shut down here or at exit, so /tmp/ray does not fill up with one folder per run.
_LOCAL_SESSIONS: list[Path] = []
_CLEANUP_AT_EXIT: list[bool] = []  # non-empty once shutdown_ray is registered with atexit


# Settings of a local Ray cluster (see init_ray).
RAY_SYSTEM_CONFIG = {"enable_metrics_collection": False, "worker_niceness": 0}


def init_ray(address: str | None, num_cpus: int | None = None) -> None:
    """Connect to a cluster (``address``) or start a small local one, quietly.

    A local cluster listens on 127.0.0.1 only: node IP 127.0.0.1 (so Ray's gRPC servers, agents
    and workers bind loopback), no dashboard, no metrics exporter. See docs/security.md."""
    if ray.is_initialized():
        return
    if address:
        join_cluster(address)
        return
    with _node_ip_stays_loopback():
        # "local": a private cluster even when RAY_ADDRESS or a `ray start` on this machine
        # (its address file) would make a bare ray.init() join that one.
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, log_to_driver=True,
                 object_store_memory=512 * 1024 * 1024, configure_logging=True, logging_level="ERROR",
                 _node_ip_address=LOOPBACK,
                 # the agent's Prometheus exporter: an unauthenticated HTTP port nobody reads here;
                 # Ray starts workers at niceness 15, and here the workers do all the training and
                 # generation: on a CPU shared with anything else they got a fraction of their cores
                 _system_config=RAY_SYSTEM_CONFIG)
    _remember_session()


def cluster_address(configured: str | None) -> str | None:
    """The cluster to join: ``trainer.ray_address``, else the RAY_ADDRESS environment variable
    (Ray's own convention), else None (start a private local cluster)."""
    return configured or os.environ.get("RAY_ADDRESS") or None


def join_cluster(address: str) -> None:
    """Connect this driver to an existing cluster. A head on a loopback address is a cluster on
    this machine: the driver's own servers then listen on loopback too (Ray would otherwise
    announce, and listen on, the machine's outward address)."""
    host = address.removeprefix("ray://").rsplit(":", 1)[0].strip("[]")
    if _is_loopback(host):
        with _node_ip_stays_loopback():
            ray.init(address=address, log_to_driver=True, _node_ip_address=LOOPBACK)
        return
    ray.init(address=address, log_to_driver=True)


@contextlib.contextmanager
def _node_ip_stays_loopback() -> Iterator[None]:
    """On Linux, Ray 2.60 turns ``_node_ip_address="127.0.0.1"`` into the machine's outward IP
    (``services.resolve_ip_for_localhost``) unless its "no clusters on this OS" flag is off; with
    that IP every Ray server listens on all interfaces. The flag is read at call time, so clear it
    for this ``ray.init`` only (the started processes get the IP on their command lines)."""
    from ray._private import ray_constants

    previous = getattr(ray_constants, "ENABLE_RAY_CLUSTER", None)
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        if previous is not None:
            ray_constants.ENABLE_RAY_CLUSTER = previous


# Written into the session folders alignctl starts: holds the driver's pid, so a later run can tell
# a folder left by a killed alignctl run (pid gone) from any other Ray user's.
SESSION_MARKER = "alignctl-driver.pid"


def _remember_session() -> None:
    context = ray.get_runtime_context()
    if not _CLEANUP_AT_EXIT:
        # Registered after Ray's own atexit hook (at ``import ray``), so it runs first (LIFO): Ray
        # stops, then its folder goes. A SIGKILLed run cannot clean up: the next local start does.
        atexit.register(shutdown_ray)
        _CLEANUP_AT_EXIT.append(True)
    session = Path(context.get_temp_dir()) / context.get_session_name()
    _remove_stale_sessions(session.parent)
    with contextlib.suppress(OSError):
        (session / SESSION_MARKER).write_text(str(os.getpid()), encoding="utf-8")
    _LOCAL_SESSIONS.append(session)


def _remove_stale_sessions(temp_dir: Path) -> None:
    """Session folders of earlier alignctl runs that were killed (marker present, driver gone)."""
    for marker in temp_dir.glob(f"session_*/{SESSION_MARKER}"):
        with contextlib.suppress(OSError, ValueError):
            if not _alive(int(marker.read_text(encoding="utf-8"))):
                shutil.rmtree(marker.parent, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def local_session_dirs() -> list[Path]:
    """Session folders of the local Ray clusters this process started and has not removed yet."""
    return list(_LOCAL_SESSIONS)


def shutdown_ray() -> None:
    """Stop Ray and remove the session folders of the local clusters this process started (only
    those: other runs on this machine may be using theirs). A cluster given by address keeps its own."""
    _PARKED.clear()  # Ray stops their processes
    ray.shutdown()
    while _LOCAL_SESSIONS:
        folder = _LOCAL_SESSIONS.pop()
        shutil.rmtree(folder, ignore_errors=True)
        latest = folder.parent / "session_latest"
        with contextlib.suppress(OSError):
            if latest.is_symlink() and Path(os.readlink(latest)) == folder:
                latest.unlink()
