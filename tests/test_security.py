"""Security of a run (issue 20): what listens, where Ray's session folder goes, which checkpoints load.

One real CPU GRPO run through the CLI (a subprocess: a fresh Ray, two gloo ranks) is watched from a
thread that reads /proc/net/tcp{,6}: no socket of the run's process tree may listen outside
127.0.0.1 / ::1, and its Ray session folder must be gone once the process ended. Its step-2
checkpoint is then tampered with in copies and resumed through the real CLI: refused with one line
and exit 2, unless ``trainer.trust_checkpoint=true``.
"""

from __future__ import annotations

import ipaddress
import json
import os
import pickle
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from alignctl.errors import UserError
from alignctl.trainers.checkpoint_trust import HOME_ENV, KEY_FILE, MANIFEST_FILE, installation_key
from conftest import REPO_ROOT, assert_user_error, run_cli
from rl_helpers import make_assets

REFUSED = "checkpoint not written by this installation"
TRUST_HINT = "trainer.trust_checkpoint=true"

# ---------------------------------------------------------------------------------------------- listeners


@dataclass(frozen=True)
class Listener:
    pid: int
    name: str
    ip: str
    port: int

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.ip)
        mapped = getattr(address, "ipv4_mapped", None)
        return address.is_loopback or (mapped is not None and mapped.is_loopback)


def _decode(hex_address: str) -> tuple[str, int]:
    """/proc/net/tcp{,6} "ADDR:PORT": the address is 32-bit words in host (little-endian) order."""
    addr, port = hex_address.split(":")
    raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
    return str(ipaddress.ip_address(raw)), int(port, 16)


def _listening_inodes() -> dict[int, tuple[str, int]]:
    found = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="ascii") as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A":  # TCP_LISTEN
                    found[int(fields[9])] = _decode(fields[1])
    return found


def _process_tree(root: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    tree, todo = set(), [root]
    while todo:
        pid = todo.pop()
        tree.add(pid)
        todo.extend(children.get(pid, []))
    return tree


def listeners_of(root: int) -> set[Listener]:
    """Every TCP socket listening in ``root``'s process tree (by socket inode, from /proc)."""
    inodes = _listening_inodes()
    found = set()
    for pid in _process_tree(root):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and int(target[8:-1]) in inodes:
                found.add(Listener(pid, name, *inodes[int(target[8:-1])]))
    return found


class ListenerWatch:
    """Collects ``listeners_of(pid)`` (and the Ray session folders in ``sessions_in``) every 0.2 s
    in a thread until stopped."""

    def __init__(self, pid: int, sessions_in: Path) -> None:
        self.pid, self.seen, self._stop = pid, set(), threading.Event()
        self.sessions_in, self.sessions = sessions_in, set()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.seen |= listeners_of(self.pid)
            self.sessions |= {p.name for p in self.sessions_in.glob("session_2*")}
            self._stop.wait(0.2)

    def stop(self) -> set[Listener]:
        self._stop.set()
        self._thread.join()
        return self.seen


def test_the_listener_scan_sees_a_socket_on_all_interfaces():
    """The scan used below can fail: a socket on 0.0.0.0 in this process is reported as such."""
    with socket.create_server(("0.0.0.0", 0)) as sock:
        port = sock.getsockname()[1]
        mine = [item for item in listeners_of(os.getpid()) if item.port == port]
    assert [(item.ip, item.loopback) for item in mine] == [("0.0.0.0", False)]


# ---------------------------------------------------------------------------------------------- one real run


def _overrides(assets: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return [
        f"data.train_files=[{assets['data'] / 'train.parquet'}]", f"actor_rollout_ref.model.path={assets['model']}",
        f"custom_reward_function.path={assets['reward']}", f"trainer.run_dir={run_dir}",
        "data.train_batch_size=4", "data.max_prompt_length=128", "data.max_response_length=16",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.rollout.n=2",
        "actor_rollout_ref.actor.optim.lr=1e-3", "trainer.total_training_steps=2", "trainer.save_freq=2",
        "trainer.n_gpus_per_node=2", "trainer.logger=[jsonl]", "trainer.val_before_train=false", *extra,
    ]


@dataclass
class WatchedRun:
    assets: dict[str, Path]
    run_dir: Path
    home: Path
    ray_tmp: Path  # Ray's temp dir: RAY_TMPDIR/ray
    code: int
    stderr: str
    seen: set[Listener]
    sessions: set[str]  # session folders that existed during the run

    @property
    def checkpoint(self) -> Path:
        return self.run_dir / "checkpoints" / "global_step_2"


@pytest.fixture(scope="module")
def watched_run(tmp_path_factory) -> Iterator[WatchedRun]:
    root = tmp_path_factory.mktemp("security")
    assets = make_assets(root, num_train=16, num_test=4)
    home = root / "home"
    # Ray's unix sockets live under its temp dir (a ~107 character limit): a short private one, so
    # that "no session folder left" is exact whatever other Ray runs share this machine.
    tmpdir = Path(tempfile.mkdtemp(prefix="ray-", dir="/tmp"))
    ray_tmp = tmpdir / "ray"
    _leftover_sessions(ray_tmp)
    env = {**os.environ, "OMP_NUM_THREADS": "1", HOME_ENV: str(home), "RAY_TMPDIR": str(tmpdir)}
    run_dir = root / "run"
    proc = subprocess.Popen([sys.executable, "-m", "alignctl", "grpo", *_overrides(assets, run_dir)], cwd=REPO_ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    watch = ListenerWatch(proc.pid, ray_tmp)
    try:
        _, err = proc.communicate(timeout=300)
    finally:
        seen = watch.stop()
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
    yield WatchedRun(assets, run_dir, home, ray_tmp, proc.returncode, err, seen, watch.sessions)
    shutil.rmtree(tmpdir, ignore_errors=True)


def test_a_local_grpo_run_listens_on_loopback_only(watched_run: WatchedRun):
    assert watched_run.code == 0, watched_run.stderr[-3000:]
    seen = watched_run.seen
    outside = sorted(f"{item.name}(pid {item.pid}) {item.ip}:{item.port}" for item in seen if not item.loopback)
    assert outside == []
    # The watch really saw the run: Ray's servers and both gloo ranks, whose rendezvous store (rank
    # 0) and pair sockets listen beside each worker's gRPC server.
    names = {item.name for item in seen}
    assert {"gcs_server", "raylet"} <= names, names
    ranks = json.loads((watched_run.run_dir / "workers.json").read_text())
    per_pid = {pid: sum(item.pid == pid for item in seen) for pid in (r["pid"] for r in ranks)}
    assert per_pid[ranks[0]["pid"]] >= 3 and per_pid[ranks[1]["pid"]] >= 2, (per_pid, sorted(map(str, seen)))


def _leftover_sessions(ray_tmp: Path) -> None:
    """What earlier runs left: an alignctl run that was SIGKILLed (its driver pid is gone) and a
    session of some other Ray user (no alignctl marker), which must be left alone."""
    from alignctl.workers.ray_session import SESSION_MARKER

    killed = ray_tmp / "session_2000-01-01_00-00-00_000000_1"
    killed.mkdir(parents=True)
    (killed / SESSION_MARKER).write_text(str(_dead_pid()))
    (ray_tmp / "session_2000-01-01_00-00-00_000000_2").mkdir()


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_the_run_leaves_no_ray_session_folder_and_removes_a_killed_runs(watched_run: WatchedRun):
    assert watched_run.code == 0, watched_run.stderr[-3000:]
    started = {name for name in watched_run.sessions if not name.startswith("session_2000")}
    assert len(started) == 1, watched_run.sessions  # the run's own, seen while it ran
    assert sorted(p.name for p in watched_run.ray_tmp.iterdir()) == ["session_2000-01-01_00-00-00_000000_2"]


def test_a_committed_checkpoint_is_signed_with_a_private_installation_key(watched_run: WatchedRun):
    key = watched_run.home / KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600 and len(key.read_bytes()) == 32
    manifest = (watched_run.checkpoint / MANIFEST_FILE).read_text()
    assert "actor/dcp/.metadata" in manifest and "trainer_state.json" in manifest


# ---------------------------------------------------------------------------------------------- resume trust


@pytest.fixture
def home(watched_run: WatchedRun, monkeypatch) -> Path:
    """The key the run signed with (never the real ~/.config/alignctl)."""
    monkeypatch.setenv(HOME_ENV, str(watched_run.home))
    return watched_run.home


class _RunsCode:
    """Pickles to "touch ``marker``, then return the real metadata": what a crafted checkpoint does."""

    def __init__(self, marker: Path, original: bytes) -> None:
        self.marker, self.original = marker, original

    def __reduce__(self):
        code = f"__import__('pathlib').Path({str(self.marker)!r}).touch() or __import__('pickle').loads({self.original!r})"
        return eval, (code,)


def _crafted_copy(run: WatchedRun, dest: Path) -> tuple[Path, Path]:
    folder = dest / "global_step_2"
    shutil.copytree(run.checkpoint, folder)
    metadata = folder / "actor" / "dcp" / ".metadata"
    marker = dest / "code-ran"
    metadata.write_bytes(pickle.dumps(_RunsCode(marker, metadata.read_bytes())))
    return folder, marker


def _resume(run: WatchedRun, folder: Path, run_dir: Path, *extra: str):
    return run_cli("grpo", *_overrides(run.assets, run_dir, f"trainer.resume_mode={folder}", *extra))


def test_a_crafted_metadata_pickle_is_refused(watched_run: WatchedRun, home: Path, tmp_path: Path):
    folder, marker = _crafted_copy(watched_run, tmp_path)
    result = _resume(watched_run, folder, tmp_path / "resumed")
    assert_user_error(result, str(folder), REFUSED, "actor/dcp/.metadata changed", TRUST_HINT)
    assert not marker.exists()
    assert not (tmp_path / "resumed").exists()


def _drop_manifest(folder: Path) -> None:
    (folder / MANIFEST_FILE).unlink()


def _add_file(folder: Path) -> None:
    (folder / "actor" / "extra.pt").write_bytes(b"\x80\x04N.")


def _remove_file(folder: Path) -> None:
    (folder / "actor" / "rng_rank1.pt").unlink()


def _edit_state(folder: Path) -> None:
    path = folder / "trainer_state.json"
    path.write_text(path.read_text() + " ")


@pytest.mark.parametrize("tamper, reason", [
    (_drop_manifest, f"no {MANIFEST_FILE}"),  # a checkpoint written by hand / by another tool
    (_add_file, "actor/extra.pt added"),
    (_remove_file, "actor/rng_rank1.pt missing"),
    (_edit_state, "trainer_state.json changed"),
])
def test_a_changed_or_unsigned_checkpoint_is_refused(watched_run: WatchedRun, home: Path, tmp_path: Path,
                                                     tamper, reason: str):
    folder = tmp_path / "global_step_2"
    shutil.copytree(watched_run.checkpoint, folder)
    tamper(folder)
    assert_user_error(_resume(watched_run, folder, tmp_path / "resumed"), REFUSED, reason, TRUST_HINT)


def test_a_checkpoint_signed_by_another_installation_is_refused(watched_run: WatchedRun, tmp_path: Path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "other-home"))
    result = _resume(watched_run, watched_run.checkpoint, tmp_path / "resumed")
    assert_user_error(result, REFUSED, "not signed with this installation's key", TRUST_HINT)


def test_a_key_readable_by_others_is_refused(tmp_path: Path, monkeypatch):
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    installation_key()
    (tmp_path / KEY_FILE).chmod(0o644)
    with pytest.raises(UserError, match="expected mode 600"):
        installation_key()


def test_trust_checkpoint_resumes_even_a_crafted_one(watched_run: WatchedRun, home: Path, tmp_path: Path):
    """The refusals above matter: trusted, the crafted pickle's code runs during the load."""
    from alignctl.workers.ray_session import local_session_dirs, shutdown_ray

    folder, marker = _crafted_copy(watched_run, tmp_path)
    try:
        result = _resume(watched_run, folder, tmp_path / "resumed", "--trust-checkpoint")  # the CLI flag of trainer.trust_checkpoint
        sessions = local_session_dirs()
    finally:
        shutdown_ray()
    assert result.code == 0, (result.stdout[-2000:], result.stderr[-2000:])
    assert "unverified (actor/dcp/.metadata changed)" in " ".join(result.stdout.split())
    assert marker.exists()
    assert (tmp_path / "resumed" / "actor" / "model.safetensors").is_file()
    assert sessions and not any(path.exists() for path in sessions)  # shutdown_ray removed them


def test_every_torch_load_in_the_package_is_weights_only():
    calls = []
    for path in (REPO_ROOT / "alignctl").rglob("*.py"):
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if "torch.load(" in line and "weights_only=True" not in line:
                calls.append(f"{path.relative_to(REPO_ROOT)}:{number}")
    assert calls == []
