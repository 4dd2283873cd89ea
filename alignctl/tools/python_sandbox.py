"""The ``python`` tool: run a snippet in a throw-away subprocess with limits. Off unless the
config enables it (``multi_turn.enable_python_tool``): it runs code the policy wrote.

Containment, in layers (each tested in tests/test_tools.py):

- a fresh interpreter (``python -I``: no user site, no PYTHON* variables) in a new empty working
  folder that is deleted afterwards, with a minimal environment and a new session (the whole
  process group is killed on timeout);
- resource limits: CPU seconds (RLIMIT_CPU), address space (RLIMIT_AS, so a 10 GB allocation is a
  MemoryError), size of any file written (RLIMIT_FSIZE), and the captured output is cut at
  ``MAX_OUTPUT`` characters;
- a network namespace of its own when the kernel allows unprivileged ones (no interfaces but
  loopback), and in any case
- a Python audit hook, installed before the snippet runs and impossible to remove from Python,
  that refuses sockets, new processes (fork, exec, spawn, ``os.system``, subprocess), ctypes
  and writes, renames or deletions outside the working folder.

It is a sandbox for honest mistakes and reward hacking by a small model, not a security boundary
for hostile code: use a container or VM for that (docs/agents.md).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile

from alignctl.tools.base import register_tool

CPU_SECONDS, MEMORY_BYTES, FILE_BYTES, MAX_OUTPUT = 5, 512 * 1024**2, 8 * 1024**2, 4000

# Runs first in the child: installs the audit hook, then executes the snippet (argv[1]).
BOOTSTRAP = r'''
import os, resource, sys
sys.dont_write_bytecode = True
_cpu, _memory, _file = (int(v) for v in sys.argv[2:5])
resource.setrlimit(resource.RLIMIT_CPU, (_cpu, _cpu))
resource.setrlimit(resource.RLIMIT_AS, (_memory, _memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (_file, _file))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
try:  # a network namespace of its own (no interfaces but loopback), where unprivileged ones exist
    import ctypes
    ctypes.CDLL(None, use_errno=True).unshare(0x10000000 | 0x40000000)  # CLONE_NEWUSER | CLONE_NEWNET
    del ctypes
except Exception:
    pass
for _name in [m for m in sys.modules if m == "ctypes" or m.startswith(("ctypes.", "_ctypes"))]:
    del sys.modules[_name]  # so that an import by the snippet goes through the audit hook
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


def run_python(code: str, *, wall_seconds: float = CPU_SECONDS + 2) -> str:
    """stdout (then stderr) of ``code``, cut at MAX_OUTPUT characters; a timeout or a limit is
    reported in the text."""
    workdir = tempfile.mkdtemp(prefix="alignctl-tool-")
    env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "HOME": workdir, "TMPDIR": workdir}
    try:
        # The limits are set by the child itself (BOOTSTRAP), not in a preexec_fn: that is unsafe
        # in a threaded parent such as a Ray worker.
        limits = [str(CPU_SECONDS), str(MEMORY_BYTES), str(FILE_BYTES)]
        proc = subprocess.Popen([sys.executable, "-I", "-c", BOOTSTRAP, code, *limits], cwd=workdir, env=env,
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=wall_seconds)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            return f"error: the code ran longer than {wall_seconds:g} s and was stopped"
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    text = out.decode(errors="replace") + err.decode(errors="replace")
    if proc.returncode < 0:
        text += f"\n[killed by signal {-proc.returncode}: a CPU or memory limit]"
    return text[:MAX_OUTPUT] + ("\n[output cut]" if len(text) > MAX_OUTPUT else "")


@register_tool("python", "Run a short Python 3 program and return what it prints (no network, no files "
                         "outside a scratch folder, limited CPU and memory).",
               {"type": "object", "properties": {"code": {"type": "string", "description": "the program"}},
                "required": ["code"]}, timeout_s=CPU_SECONDS + 4)
def python(code: str) -> str:
    return run_python(code)
