"""The body of one fused worker process: the Ray actor that joins the torch.distributed group and
holds the roles placed on its pool (actor+rollout+ref, critic, reward model) as plain Python
objects. :mod:`alignctl.workers.group` starts one per bundle and dispatches calls to them.
"""

from __future__ import annotations

import importlib
import os
import socket
import sys
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import ray

from alignctl import cpu_heap
from alignctl.workers.ray_session import is_loopback


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

# Rendezvous timeout, as torch's default for a tcp:// init_method (slow model loads on busy hosts).
STORE_TIMEOUT = timedelta(minutes=30)


def listening_socket(ip: str) -> socket.socket:
    """A socket listening on ``ip`` only (never 0.0.0.0), on a port the kernel picks."""
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.bind((ip, 0))
    sock.listen(128)
    return sock


def _loopback_interface() -> str:
    return "lo0" if sys.platform == "darwin" else "lo"


class WorkerProcess:
    """One fused worker process (wrapped by ``ray.remote`` in ``WorkerGroup``)."""

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
        self._store_socket = listening_socket(ip)
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
        if is_loopback(master_addr):
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
        for role in self.roles.values():
            close = getattr(role, "close", None)
            if close is not None:
                close()
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


def worker_env(import_paths: list[str] | None = None) -> dict[str, str]:
    """The environment variables a group's workers start with."""
    env = dict(WORKER_ENV)
    if cpu_heap.ENV_VAR in os.environ:  # the user's choice reaches workers on other nodes too
        env[cpu_heap.ENV_VAR] = os.environ[cpu_heap.ENV_VAR]
    if import_paths:
        env["PYTHONPATH"] = os.pathsep.join([*import_paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env
