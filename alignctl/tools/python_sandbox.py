"""The ``python`` tool: run a snippet the policy wrote, isolated, with limits. Off unless the config
enables it (``multi_turn.enable_python_tool``).

Isolation (``multi_turn.isolation``):

- ``bwrap`` (the default): the snippet runs under bubblewrap (alignctl/tools/bwrap.py says
  exactly what it sees); when bubblewrap cannot run here the config is refused before anything
  starts.
- ``none``: a plain subprocess, for those who accept running model-written code as themselves.

Limits, in both modes: CPU seconds (RLIMIT_CPU), address space per process (RLIMIT_AS, so a
10 GB allocation is a MemoryError), size of a written file (RLIMIT_FSIZE), wall-clock seconds
(the whole sandbox is killed), and output (reading stops, and the sandbox is killed, past
``OUTPUT_BYTES``; the text is cut at ``MAX_OUTPUT`` characters). Under bwrap also processes
(RLIMIT_NPROC, counted per user namespace, so only the sandbox's own tasks count; root runs the
sandbox as nobody because the kernel exempts root from this limit) and scratch space (a tmpfs of
``SCRATCH_BYTES``).

A Python audit hook stays as a second layer: it refuses sockets, new processes, ctypes and writes
outside the working folder. Code in the same interpreter can switch it off, which is why it is
not the boundary.
"""

from __future__ import annotations

import os
import selectors
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from alignctl.tools import bwrap
from alignctl.tools.tool import register_tool

CPU_SECONDS, MEMORY_BYTES, FILE_BYTES, MAX_PROCESSES = 5, 512 * 1024**2, 8 * 1024**2, 16
MAX_OUTPUT, OUTPUT_BYTES = 4000, 64 * 1024
ISOLATION_MODES = ("bwrap", "none")
_EXIT_GRACE_S = 0.5  # how long pipes may stay open after the snippet's process exited

# Runs first in the child: sets the limits, installs the audit hook, then executes the snippet (argv[1]).
BOOTSTRAP = r'''
import os, resource, sys
sys.dont_write_bytecode = True
_cpu, _memory, _file, _nproc = (int(v) for v in sys.argv[2:6])
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu))
resource.setrlimit(resource.RLIMIT_AS, (_memory, _memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (_file, _file))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
if _nproc:
    resource.setrlimit(resource.RLIMIT_NPROC, (_nproc, _nproc))
_ROOT = os.path.realpath(os.getcwd())
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_BLOCKED = ("socket.", "subprocess.", "os.fork", "os.forkpty", "os.exec", "os.spawn", "os.posix_spawn",
            "os.system", "os.kill", "os.killpg", "ctypes.", "pty.", "os.setuid", "os.chroot")
_PATH_EVENTS = {"os.remove": 0, "os.rename": (0, 1), "os.replace": (0, 1), "os.rmdir": 0, "os.mkdir": 0,
                "os.chmod": 0, "os.chown": 0, "os.symlink": (0, 1), "os.link": (0, 1), "os.truncate": 0,
                "os.utime": 0, "shutil.rmtree": 0, "shutil.copyfile": 1, "shutil.move": (0, 1)}

def _inside(path):
    if isinstance(path, int):
        return True  # an already open descriptor
    real = os.path.realpath(os.fsdecode(path))
    return real == _ROOT or real.startswith(_ROOT + os.sep)

def _hook(event, args):
    if event.startswith(_BLOCKED) or (event == "import" and args and args[0] in ("ctypes", "_ctypes")):
        raise PermissionError(f"sandbox: {event} is not allowed")
    if event == "open" and args:
        path, mode, flags = (list(args) + [None, None, 0])[:3]
        writing = (mode is not None and any(c in str(mode) for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
        if writing and path is not None and not _inside(path):
            raise PermissionError(f"sandbox: writing {path!r} outside the working folder is not allowed")
    elif event in _PATH_EVENTS and args:
        where = _PATH_EVENTS[event]
        for i in (where if isinstance(where, tuple) else (where,)):
            if i < len(args) and args[i] is not None and not _inside(args[i]):
                raise PermissionError(f"sandbox: {event} outside the working folder is not allowed")

_code = sys.argv[1]
sys.argv = ["<tool>"]
del resource
sys.addaudithook(_hook)
exec(compile(_code, "<tool>", "exec"), {"__name__": "__main__"})
'''


@dataclass
class Captured:
    stdout: bytes
    stderr: bytes
    returncode: int | None  # None: killed by us (wall clock or output limit)
    stopped: str = ""  # why we killed it: "wall" or "output"


def run_python(code: str, *, isolation_mode: str = "bwrap", wall_seconds: float = CPU_SECONDS + 2) -> str:
    """stdout (then stderr) of ``code``, cut at MAX_OUTPUT characters; a timeout or a limit is
    reported in the text."""
    if isolation_mode not in ISOLATION_MODES:
        raise ValueError(f"isolation must be one of {', '.join(ISOLATION_MODES)}, got {isolation_mode!r}")
    limits = [str(CPU_SECONDS), str(MEMORY_BYTES), str(FILE_BYTES)]
    if isolation_mode == "bwrap":
        problem = bwrap.isolation_problem()
        if problem:
            return f"error: {problem}"
        runtime = bwrap.Runtime.current()
        argv = [runtime.interpreter, "-I", "-S", "-B", "-c", BOOTSTRAP, code, *limits, str(MAX_PROCESSES)]
        got = _capture(bwrap.sandbox_command(runtime, argv), wall_seconds, env=bwrap.BWRAP_ENV,
                       **bwrap.popen_identity())
        return _report(got, wall_seconds, signal_offset=128)  # bwrap exits 128 + signal for a killed snippet
    workdir = tempfile.mkdtemp(prefix="alignctl-tool-")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    try:  # no RLIMIT_NPROC here: outside a user namespace it would count every process of this user
        got = _capture([sys.executable, "-I", "-c", BOOTSTRAP, code, *limits, "0"], wall_seconds, cwd=workdir,
                       env=env)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return _report(got, wall_seconds, signal_offset=None)


def _capture(command: list[str], wall_seconds: float, **popen: object) -> Captured:
    """Run ``command`` reading its output as it comes; kill it (its whole process group, and under
    bwrap with it the PID namespace) at the wall-clock limit or past OUTPUT_BYTES. Returns by the
    limit even when a process that escaped the kill keeps the pipes open."""
    proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True, **popen)  # type: ignore[call-overload]
    chunks: dict[int, list[bytes]] = {proc.stdout.fileno(): [], proc.stderr.fileno(): []}  # type: ignore[union-attr]
    deadline, exited_at, total, stopped = time.monotonic() + wall_seconds, None, 0, ""
    with selectors.DefaultSelector() as selector:
        for pipe in (proc.stdout, proc.stderr):
            os.set_blocking(pipe.fileno(), False)  # type: ignore[union-attr]
            selector.register(pipe, selectors.EVENT_READ)  # type: ignore[arg-type]
        while selector.get_map():
            now = time.monotonic()
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if now >= deadline or (exited_at is not None and now - exited_at > _EXIT_GRACE_S):
                stopped = "wall" if exited_at is None else ""
                break
            for key, _ in selector.select(timeout=min(deadline - now, 0.05)):
                data = os.read(key.fd, 65536)
                if not data:
                    selector.unregister(key.fileobj)
                    continue
                chunks[key.fd].append(data)
                total += len(data)
            if total > OUTPUT_BYTES:
                stopped = "output"
                break
    _kill(proc)
    out, err = (b"".join(chunks[p.fileno()]) for p in (proc.stdout, proc.stderr))  # type: ignore[union-attr]
    proc.stdout.close(), proc.stderr.close()  # type: ignore[union-attr, func-returns-value]
    return Captured(out, err, None if stopped else proc.returncode, stopped)


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait()


def _report(got: Captured, wall_seconds: float, signal_offset: int | None) -> str:
    if got.stopped == "wall":
        return f"error: the code ran longer than {wall_seconds:g} s and was stopped"
    text = got.stdout.decode(errors="replace") + got.stderr.decode(errors="replace")
    code = got.returncode
    signum = -code if code is not None and code < 0 else (
        code - signal_offset if signal_offset and code is not None and code > signal_offset else 0)
    if signum:
        text += f"\n[killed by signal {signum}: a CPU or memory limit]"
    cut = got.stopped == "output" or len(text) > MAX_OUTPUT
    return text[:MAX_OUTPUT] + ("\n[output cut]" if cut else "")


@register_tool("python", "Run a short Python 3 program and return what it prints (standard library only; no "
                         "network, no files but a scratch folder, limited CPU, memory and processes).",
               {"type": "object", "properties": {"code": {"type": "string", "description": "the program"}},
                "required": ["code"]}, timeout_s=CPU_SECONDS + 4, settings=("isolation",))
def python(code: str, isolation: str = "bwrap") -> str:
    return run_python(code, isolation_mode=isolation)


def python_tool_problem(isolation_mode: str) -> str | None:
    """Why the python tool cannot run with ``isolation_mode`` on this machine (for the config check)."""
    return bwrap.isolation_problem() if isolation_mode == "bwrap" else None

