"""Multi-node Ray clusters on one machine for tests, bound to loopback, torn down by their own
process ids only (other Ray users on the machine are never touched).

- ``simulated_cluster``: Ray's own test harness (``ray.cluster_utils.Cluster``), several raylets in
  this process's care, each with its own CPUs and a custom resource naming it.
- ``RayStartCluster``: real ``ray start`` processes (a head and worker nodes), each in its own
  process group and with a private ``--temp-dir``.

``ray start --node-ip-address=127.0.0.1`` alone does not stay on loopback on Linux: Ray turns a
loopback address into the machine's outward one (``services.resolve_ip_for_localhost``) and its
servers listen there. The CLI is therefore run with that one function replaced by the identity,
so every server of these clusters listens on 127.0.0.1 (checked by the tests with ``ss``).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

LOOPBACK = "127.0.0.1"
# `ray ...` with loopback kept as given (see the module docstring).
RAY_CLI = [sys.executable, "-c", "import sys; import ray._private.services as s; s.resolve_ip_for_localhost = "
           "lambda host: host; from ray.scripts.scripts import main; sys.argv[0] = 'ray'; main()"]
# As alignctl's own local clusters: no metrics exporter, workers not niced.
RAY_ENV = {"RAY_enable_metrics_collection": "0", "RAY_worker_niceness": "0", "RAY_USAGE_STATS_ENABLED": "0"}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


def short_temp_dir(prefix: str) -> str:
    """Ray's Unix socket paths live under the temp dir and must stay short (about 107 bytes)."""
    return tempfile.mkdtemp(prefix=prefix, dir="/tmp")


class RayStartCluster:
    """``ray start`` raylets: node 0 is the head; ``resources[i]`` names node i (e.g. {"node_a": 1})."""

    def __init__(self, resources: list[dict[str, float]], num_cpus: int = 1) -> None:
        self.temp_dir = short_temp_dir("rs")
        self.port = free_port()
        self.address = f"{LOOPBACK}:{self.port}"
        self.procs: list[subprocess.Popen[bytes]] = []
        # Token authentication, as a real cluster has it (Ray turns it on for `ray start` when
        # ~/.ray/auth_token exists): a token of this cluster's own, passed to every process that
        # joins it; a driver given an explicit address must be told (RAY_AUTH_MODE=token).
        self.env = {**os.environ, **RAY_ENV, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
        try:
            for i, extra in enumerate(resources):
                self._start_node(i == 0, extra, num_cpus)
                self._wait_for_nodes(i + 1)
        except BaseException:
            self.stop()
            raise

    def _start_node(self, head: bool, resources: dict[str, float], num_cpus: int) -> None:
        ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port"]
        args = [*RAY_CLI, "start", "--block", f"--node-ip-address={LOOPBACK}", f"--num-cpus={num_cpus}",
                f"--resources={json.dumps(resources)}", f"--temp-dir={self.temp_dir}", "--disable-usage-stats",
                "--min-worker-port=0", "--max-worker-port=0", *[f"{flag}={free_port()}" for flag in ports]]
        if head:
            args += ["--head", f"--port={self.port}", "--include-dashboard=false",
                     f"--ray-client-server-port={free_port()}"]
        else:
            args += [f"--address={self.address}"]
        log = open(Path(self.temp_dir) / f"start-{len(self.procs)}.log", "wb")  # noqa: SIM115 - kept for the process
        # A session (and process group) of its own: teardown kills exactly this group.
        self.procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                           env=self.env))

    def _wait_for_nodes(self, count: int, timeout: float = 90.0) -> None:
        deadline = time.time() + timeout
        while time.time() < deadline:
            for proc in self.procs:
                if proc.poll() is not None:
                    raise RuntimeError(f"ray start exited ({proc.returncode}); see {self.temp_dir}/start-*.log")
            if self.alive_nodes() >= count:
                return
            time.sleep(1.0)
        raise RuntimeError(f"{count} raylets did not come up within {timeout:.0f} s; see {self.temp_dir}")

    def alive_nodes(self) -> int:
        """Live nodes, asked from a separate short-lived driver (this process stays unconnected)."""
        code = ("import ray, sys; from alignctl.workers.ray_session import join_cluster; join_cluster(sys.argv[1]);"
                "print(sum(n['Alive'] for n in ray.nodes()))")
        out = subprocess.run([sys.executable, "-c", code, self.address], capture_output=True, text=True,
                             env=self.env, timeout=60)
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0

    def pids(self) -> list[int]:
        """Every live process of this cluster: the process groups started here, and any process
        whose command line names this cluster's private temp dir."""
        found = set()
        for proc in self.procs:
            found |= _group_members(proc.pid)
        listing = subprocess.run(["pgrep", "-f", self.temp_dir], capture_output=True, text=True).stdout
        found |= {int(p) for p in listing.split()}
        found.discard(os.getpid())
        return sorted(found)

    def stop(self) -> None:
        """SIGTERM (Ray drains for up to 30 s; a test cluster has nothing to drain), then SIGKILL,
        then the private temp dir goes."""
        for sig, wait in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
            pids = self.pids()
            if not pids:
                break
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, sig)
            deadline = time.time() + wait
            while time.time() < deadline and self.pids():
                time.sleep(0.2)
            for proc in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=0.1)
        if not self.pids():
            shutil.rmtree(self.temp_dir, ignore_errors=True)


def _group_members(pgid: int) -> set[int]:
    listing = subprocess.run(["ps", "-eo", "pid=,pgid="], capture_output=True, text=True).stdout
    return {int(pid) for pid, group in (line.split() for line in listing.splitlines()) if int(group) == pgid}


def listeners_outside_loopback(pids: list[int]) -> list[str]:
    """``ss`` lines of TCP/UDP sockets listening on a non-loopback address, held by ``pids``."""
    out = subprocess.run(["ss", "-H", "-ltunp"], capture_output=True, text=True).stdout
    bad = []
    for line in out.splitlines():
        fields = line.split()
        local = fields[4] if len(fields) > 4 else ""
        host = local.rsplit(":", 1)[0].strip("[]").removeprefix("::ffff:")
        if host.startswith("127.") or host == "::1":
            continue
        if any(f"pid={pid}," in line for pid in pids):
            bad.append(line)
    return bad


@contextlib.contextmanager
def simulated_cluster(resources: list[dict[str, float]], num_cpus: int = 1) -> Iterator[Any]:
    """``ray.cluster_utils.Cluster`` with one raylet per entry, on loopback, in a private temp dir
    (its address file too, so no other Ray user on this machine would pick it up); yields it
    after connecting this driver."""
    import ray
    from ray.cluster_utils import Cluster

    from alignctl.workers.ray_session import RAY_SYSTEM_CONFIG, _node_ip_stays_loopback, join_cluster

    temp_dir = short_temp_dir("rc")
    os.makedirs(os.path.join(temp_dir, "ray"))
    previous = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = temp_dir  # where Cluster writes its address file
    cluster = None
    try:
        with _node_ip_stays_loopback():
            common = {"node_ip_address": LOOPBACK, "num_cpus": num_cpus, "temp_dir": temp_dir}
            cluster = Cluster(initialize_head=True, head_node_args={
                **common, "resources": resources[0], "include_dashboard": False, "_system_config": RAY_SYSTEM_CONFIG})
            for extra in resources[1:]:
                cluster.add_node(**common, resources=extra)
        join_cluster(cluster.address)
        yield cluster
    finally:
        if ray.is_initialized():
            ray.shutdown()  # this driver's connection to the cluster started above
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(temp_dir, ignore_errors=True)
        if previous is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = previous
