"""The Ray session of this driver: start a private local cluster or join one, and clean up after it.

A local cluster listens on 127.0.0.1 only (docs/security.md). On Linux that needs a patch of one
of Ray's private constants for the duration of ``ray.init`` (:func:`_node_ip_stays_loopback`).
Session folders of the local clusters this process started are removed when Ray is shut down here
or at exit, and those of killed alignctl runs at the next local start, so /tmp/ray does not fill up
with one folder per run.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

import ray

LOOPBACK = "127.0.0.1"

# Session folders (<ray temp dir>/session_*) of the local clusters this process started; removed
# when Ray is shut down here or at exit, so /tmp/ray does not fill up with one folder per run.
_LOCAL_SESSIONS: list[Path] = []
_CLEANUP_AT_EXIT: list[bool] = []  # non-empty once shutdown_ray is registered with atexit
# Called by shutdown_ray before Ray stops (parked worker groups forget their processes).
_AT_SHUTDOWN: list[Callable[[], None]] = []


def is_loopback(ip: str) -> bool:
    try:
        return ipaddress.ip_address(ip).is_loopback
    except ValueError:
        return ip == "localhost"


def at_shutdown(fn: Callable[[], None]) -> None:
    """Run ``fn`` in :func:`shutdown_ray`, before Ray stops (once per function)."""
    if fn not in _AT_SHUTDOWN:
        _AT_SHUTDOWN.append(fn)


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
    if is_loopback(host):
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
    for fn in _AT_SHUTDOWN:
        fn()
    ray.shutdown()
    while _LOCAL_SESSIONS:
        folder = _LOCAL_SESSIONS.pop()
        shutil.rmtree(folder, ignore_errors=True)
        latest = folder.parent / "session_latest"
        with contextlib.suppress(OSError):
            if latest.is_symlink() and Path(os.readlink(latest)) == folder:
                latest.unlink()
