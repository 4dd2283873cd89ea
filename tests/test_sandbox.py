"""The python tool's bubblewrap sandbox, attacked through the tool's own interface
(``run_tool(TOOLS.get("python"), ...)``), one test per escape class: hook tampering, dir_fd and sqlite
writes, fork_exec and fork counts, a detached child and a stdout-holding child, the checkpoint key
and the parent's environment, network, memory, and the chain that planted a signed checkpoint.

Most attacks first switch the audit hook off (it lives in the snippet's own interpreter), so what
holds is the sandbox. Where an attack is shown to work with ``isolation=none`` too, that run is the
control: it proves the attack code does what it claims, so its failure under bwrap means something.
"""

from __future__ import annotations

import concurrent.futures
import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

import alignctl
from alignctl.tools import TOOLS, run_tool
from alignctl.tools.bwrap import Runtime
from alignctl.tools.python_sandbox import MAX_PROCESSES
from sandbox_helpers import bwrap_or_skip


@pytest.fixture(autouse=True)
def _sandbox_available() -> None:
    bwrap_or_skip()


# Rebinds the globals the audit hook reads in the bootstrap's __main__: after this the hook refuses nothing.
TAMPER = ("import sys\nm = sys.modules['__main__']\nm._BLOCKED = ('nothing.',)\nm._inside = lambda p: True\n"
          "m._PATH_EVENTS = {}\n")


def call(code: str, isolation: str = "bwrap") -> tuple[str, float]:
    """(the tool's text, seconds) for one call through the registered tool."""
    tool = TOOLS.get("python").configured({"isolation": isolation})
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        start = time.perf_counter()
        result = run_tool(tool, "python", {"code": code}, pool)
        return result.content, time.perf_counter() - start


def survivors(marker: str, wait_s: float = 1.0) -> list[int]:
    """Processes whose command line holds ``marker`` (every process of a sandboxed snippet does:
    the code is an argument of its interpreter, and forks keep it), after up to ``wait_s`` for the
    kernel to finish killing a namespace (a zombie's command line is empty)."""
    deadline = time.monotonic() + wait_s
    while True:
        found = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                try:
                    if marker.encode() in (entry / "cmdline").read_bytes():
                        found.append(int(entry.name))
                except OSError:
                    continue
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def marked(code: str) -> tuple[str, str]:
    marker = f"marker-{uuid.uuid4().hex}"
    return f"# {marker}\n{code}", marker


# ------------------------------------------------------------------------------ the file system


def test_hook_tampering_switches_the_hook_off_but_not_the_sandbox(tmp_path):
    target = tmp_path / "planted.txt"
    code = TAMPER + f"open({str(target)!r}, 'w').write('x')\nprint('written')"
    text, _ = call(code, "none")
    assert text == "written\n" and target.exists()  # control: the tampered hook lets the write through
    target.unlink()
    text, _ = call(code)
    assert "FileNotFoundError" in text and not target.exists()  # the host folder is not there at all


def test_the_sandbox_sees_the_runtime_and_its_scratch_only(tmp_path, monkeypatch):
    project = Path(alignctl.__file__).resolve().parents[1]
    home = tmp_path / "alignctl-home"
    home.mkdir()
    monkeypatch.setenv("ALIGNCTL_HOME", str(home))
    host_tmp = Path(os.environ.get("TMPDIR", "/tmp"))
    runtime = Runtime.current()
    # what the home holds, but the folders on the way to the interpreter (a pyenv one lives there)
    in_home = [p for p in Path.home().iterdir() if not runtime.interpreter.startswith(str(p) + os.sep)]
    probe = TAMPER + "import os, sys\n" + "\n".join(
        f"print({str(p)!r}, os.path.exists({str(p)!r}))"
        for p in (project, home, *in_home[:20], tmp_path, host_tmp / "ray", Path(os.sys.prefix), Path("/etc/passwd"),
                  Path("/usr/bin"), Path("/var"))) + "\nprint(sorted(os.listdir('/')), os.getcwd(), sys.path[1:])"
    text, _ = call(probe)
    lines = text.splitlines()
    assert all(line.endswith(" False") for line in lines[:-1]), text
    assert lines[-1].startswith("['dev', 'etc', 'lib', 'lib64', 'proc', ") and " /tmp [" in lines[-1], text
    assert "site-packages" not in lines[-1]  # the standard library only, no installed package


def test_dir_fd_and_sqlite_writes_stay_out_of_the_host(tmp_path):
    code = (f"import os, sqlite3\nfd = os.open({str(tmp_path)!r}, os.O_RDONLY)\n"
            "os.close(os.open('via_dir_fd', os.O_WRONLY | os.O_CREAT, dir_fd=fd))\n"
            f"sqlite3.connect({str(tmp_path / 'x.db')!r}).execute('create table t (x)')\nprint('written')")
    text, _ = call(code, "none")  # control: the hook alone missed both (no tampering needed)
    assert text == "written\n" and (tmp_path / "via_dir_fd").exists() and (tmp_path / "x.db").exists()
    for path in tmp_path.iterdir():
        path.unlink()
    text, _ = call(code)
    assert "FileNotFoundError" in text and list(tmp_path.iterdir()) == []
    # and what the sandbox can reach of its own is read-only, but its scratch folder
    text, _ = call(TAMPER + "import os, sqlite3\nfd = os.open('/usr/lib', os.O_RDONLY)\n"
                   "for attempt in (lambda: os.open('x', os.O_WRONLY | os.O_CREAT, dir_fd=fd),\n"
                   "                lambda: sqlite3.connect('/usr/lib/x.db').execute('create table t (x)'),\n"
                   "                lambda: open('/x', 'w'), lambda: open('/dev/x', 'w')):\n"
                   "    try:\n        attempt()\n        print('wrote')\n"
                   "    except Exception as exc:\n        print(type(exc).__name__)\n"
                   "sqlite3.connect('/tmp/ok.db').execute('create table t (x)')\nprint('scratch ok')")
    assert text.split() == ["OSError", "OperationalError", "OSError", "OSError", "scratch", "ok"], text


def test_scratch_space_is_bounded():
    text, _ = call("n = 0\ntry:\n    while True:\n        open(f'/tmp/f{n}', 'wb').write(b'x' * 4 * 1024**2)\n"
                   "        n += 1\nexcept OSError as exc:\n    print(n, exc.strerror)")
    count, why = text.split(maxsplit=1)
    assert int(count) < 17 and why.strip() == "No space left on device", text  # 64 MiB of tmpfs


# ------------------------------------------------------------------------------ processes


def test_fork_exec_starts_nothing_outside_the_sandbox():
    project = str(Path(alignctl.__file__).resolve().parents[1])
    code = TAMPER + ("import subprocess, sys\n"
                     "for argv in (['/bin/sh', '-c', 'echo pwned'], ['/usr/bin/env']):\n"
                     "    try:\n        subprocess.run(argv)\n    except OSError as exc:\n"
                     "        print(type(exc).__name__)\n"
                     f"child = {f'import os; print(os.path.exists({project!r}))'!r}\n"
                     "out = subprocess.run([sys.executable, '-c', child], capture_output=True, text=True).stdout\n"
                     "print('child sees project:', out.strip())")
    text, _ = call(code)
    assert text.splitlines() == ["FileNotFoundError", "FileNotFoundError", "child sees project: False"], text


FORK_EXEC = r'''
import _posixsubprocess, os, sys
r, w = os.pipe()
child = "open({target!r}, 'w').write('x')"
pid = _posixsubprocess.fork_exec([sys.executable, '-c', child], [os.fsencode(sys.executable)], True, (w,), None, None,
                                 -1, -1, -1, -1, -1, -1, r, w, True, False, -1, None, None, None, -1, None, False)
os.close(w)
print('started', os.read(r, 100), os.waitpid(pid, 0)[1] != 0)
'''


def test_fork_exec_raises_no_audit_event_and_still_starts_nothing_outside(tmp_path):
    target = tmp_path / "from_child.txt"
    code = FORK_EXEC.format(target=str(target))  # no tampering: the hook never hears of this process
    text, _ = call(code, "none")
    assert text == "started b'' False\n" and target.exists()  # control: the child wrote on the host
    target.unlink()
    text, _ = call(code)
    # it ran, inside the sandbox, where the host folder does not exist
    assert text.startswith("started b'' True\n") and "FileNotFoundError" in text and not target.exists()


def test_a_fork_bomb_is_bounded_and_nothing_survives():
    code, marker = marked(TAMPER + (
        "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n"
        "            time.sleep(60)\n            os._exit(0)\n        n += 1\n"
        "except OSError as exc:\n    print(n, exc.errno)"))
    text, seconds = call(code)
    forks, errno = text.split()
    # bwrap's process 1 and the snippet already count against the limit
    assert int(forks) == MAX_PROCESSES - 2 and int(errno) == 11, text  # EAGAIN
    assert seconds < 5 and survivors(marker) == []


def test_a_detached_child_holding_stdout_does_not_hold_the_call():
    code, marker = marked(TAMPER + (
        "import os, sys, time\nif os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n"
        "        while True:\n            print('still here', flush=True)\n            time.sleep(0.2)\n"
        "    os._exit(0)\nprint('parent done', flush=True)"))
    text, seconds = call(code)
    assert text.startswith("parent done") and seconds < 3, (text, seconds)
    assert survivors(marker) == []


def test_the_wall_limit_kills_the_whole_sandbox():
    code, marker = marked(TAMPER + (
        "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(600)\n"
        "print('looping', flush=True)\nwhile True:\n    time.sleep(1)"))
    tool = TOOLS.get("python")
    text, seconds = call(code)
    assert text.startswith("error: the code ran longer than") and seconds < tool.timeout_s, (text, seconds)
    assert survivors(marker) == []


# ------------------------------------------------------------------------------ secrets, network, memory


def test_the_key_and_the_parents_environment_are_out_of_reach(tmp_path, monkeypatch):
    from alignctl.trainers.checkpoint_trust import installation_key, key_path

    monkeypatch.setenv("ALIGNCTL_HOME", str(tmp_path / "home"))
    secret = f"ALIGNCTL_TEST_SECRET=secret-{uuid.uuid4().hex}"
    monkeypatch.setenv(*secret.split("=", 1))  # in the environment bwrap would inherit
    # /proc/<pid>/environ shows a process's environment as it started: this process's own entries
    started = [e.decode() for e in Path(f"/proc/{os.getpid()}/environ").read_bytes().split(b"\0") if len(e) > 12]
    key = installation_key()
    code = TAMPER + (
        "import os\n"
        f"try:\n    print(open({str(key_path())!r}, 'rb').read().hex())\nexcept OSError as exc:\n"
        "    print('key:', type(exc).__name__)\n"
        f"needles = {[secret, *started]!r}\n"
        "seen = ['\\0'.join(f'{k}={v}' for k, v in os.environ.items())]\n"
        "for pid in {p for p in os.listdir('/proc') if p.isdigit()} | {str(os.getppid())}:\n"
        "    try:\n        seen.append(open(f'/proc/{pid}/environ', 'rb').read().decode(errors='replace'))\n"
        "    except OSError:\n        pass\n"
        "print('entries seen:', sum(n in text for n in needles for text in seen))")
    text, _ = call(code, "none")
    # control: the same code as the same user outside a sandbox reads the key and its parent's environment
    assert key.hex() in text and "entries seen: 0" not in text, text
    text, _ = call(code)
    assert text.splitlines() == ["key: FileNotFoundError", "entries seen: 0"], text


def test_no_network_reaches_the_host():
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    server.settimeout(0.2)
    port, accepted = server.getsockname()[1], []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                accepted.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    code = TAMPER + ("import socket\ntry:\n"
                     f"    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n"
                     "except OSError as exc:\n    print(type(exc).__name__)\n"
                     "try:\n    socket.create_connection(('1.1.1.1', 53), timeout=2)\n    print('connected')\n"
                     "except OSError as exc:\n    print(type(exc).__name__)")
    try:
        text, _ = call(code, "none")
        assert text.startswith("connected") and len(accepted) == 1  # control: the host's loopback answers
        text, _ = call(code)
        time.sleep(0.3)
        assert text.split() == ["ConnectionRefusedError", "OSError"] and len(accepted) == 1, text
    finally:
        stop.set()
        thread.join()
        server.close()
        for conn in accepted:
            conn.close()


def test_memory_is_limited_per_process():
    text, _ = call(TAMPER + "x = bytearray(10 * 1024**3)")
    assert "MemoryError" in text
    text, _ = call(TAMPER + "import os\nif os.fork() == 0:\n    try:\n        x = bytearray(2 * 1024**3)\n"
                   "    except MemoryError:\n        print('child: MemoryError', flush=True)\n    os._exit(0)\n"
                   "os.wait()")
    assert text == "child: MemoryError\n"


# ------------------------------------------------------------------------------ the chain to the trainer

PLANT = r'''
import hashlib, hmac, json, os, pickle
root, key_file = {root!r}, {key!r}
key = open(key_file, 'rb').read()
folder = os.path.join(root, 'global_step_99')
os.makedirs(folder)
open(os.path.join(folder, 'trainer_state.json'), 'w').write(json.dumps({{"format": 1, "step": 99}}))
open(os.path.join(folder, 'payload.pkl'), 'wb').write(pickle.dumps("pwned"))
files = []
for name in sorted(os.listdir(folder)):
    data = open(os.path.join(folder, name), 'rb').read()
    files.append({{"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}})
payload = json.dumps({{"format": 1, "files": files}}, sort_keys=True, separators=(",", ":"))
signature = hmac.new(key, payload.encode(), hashlib.sha256).hexdigest()
json.dump({{"format": 1, "files": files, "hmac_sha256": signature}}, open(os.path.join(folder, 'checkpoint_manifest.json'), 'w'))
open(os.path.join(root, 'latest_checkpointed_iteration.txt'), 'w').write('99\n')
print('planted')
'''


def test_sandboxed_code_cannot_plant_a_signed_checkpoint(tmp_path, monkeypatch):
    from alignctl.trainers.checkpoint_folders import resolve_resume
    from alignctl.trainers.checkpoint_trust import installation_key, key_path

    monkeypatch.setenv("ALIGNCTL_HOME", str(tmp_path / "home"))
    installation_key()
    root = tmp_path / "run" / "checkpoints"
    root.mkdir(parents=True)
    code = TAMPER + PLANT.format(root=str(root), key=str(key_path()))
    text, _ = call(code, "none")  # control: unisolated, the chain works and the resume would load it
    assert text == "planted\n" and resolve_resume("auto", root) == root / "global_step_99"
    for path in sorted(root.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() else path.unlink()
    text, _ = call(code)
    assert "FileNotFoundError" in text and list(root.iterdir()) == [], text
    assert resolve_resume("auto", root) is None
