"""Bubblewrap (``bwrap``) command lines that isolate one run of model-written code.

What the sandboxed process gets (everything else of the host is absent, not just forbidden):

- a root of its own (tmpfs) holding, read-only, the Python interpreter, its standard library
  (without the interpreter's site-packages) and libpython, the system's shared libraries
  (``/usr/lib``, ``/usr/lib64`` and the ``/lib*`` links to them) and ``/etc/ld.so.cache``;
- a private writable ``/tmp`` (tmpfs of ``SCRATCH_BYTES``), its working folder; no host /tmp,
  home, project, run folder or ``$ALIGNCTL_HOME`` (so no checkpoint key);
- fresh ``/proc`` and ``/dev`` of a new PID namespace: it sees only its own processes;
- new user, network (a loopback device only), IPC, UTS and cgroup namespaces; no capabilities; a new
  session (no terminal to inject into); an empty environment but HOME, TMPDIR, LANG and PATH;
- ``--die-with-parent``: when bwrap is killed, the namespace's first process gets SIGKILL and the
  kernel kills every other process of the namespace with it, so nothing outlives the call.

When alignctl runs as root, bwrap runs as ``nobody`` (65534): the sandboxed processes are then
counted against RLIMIT_NPROC (the kernel exempts root) and own nothing on the host. An interpreter
``nobody`` cannot reach (pyenv's under /root, mode 700) is shown from a hard-linked copy in a
root-owned folder everyone can read (``SHARED_RUNTIMES``), made once per interpreter build.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from dataclasses import dataclass
from pathlib import Path

SCRATCH_BYTES, SHM_BYTES = 64 * 1024**2, 16 * 1024**2
NOBODY = 65534
SHARED_RUNTIMES = "/var/cache/alignctl/python"
# the interpreter's own site-packages (the venv's is never mounted) and what a snippet has no use for
STDLIB_LEFT_OUT = ("site-packages", "test", "idlelib", "tkinter", "turtledemo", "ensurepip")
# bwrap's own environment: its process 1 in the sandbox keeps it, readable as /proc/1/environ
BWRAP_ENV = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
SYSTEM_LIBRARIES = ("/usr/lib", "/usr/lib64", "/lib", "/lib64", "/lib32", "/libx32")
FIX_BWRAP = ("install bubblewrap (apt-get install bubblewrap; dnf install bubblewrap) or set "
             "actor_rollout_ref.rollout.multi_turn.isolation=none to run model-written code unisolated")
FIX_USERNS = ("allow unprivileged user namespaces (sysctl -w kernel.unprivileged_userns_clone=1, "
              "user.max_user_namespaces > 0, or on Ubuntu kernel.apparmor_restrict_unprivileged_userns=0) or set "
              "actor_rollout_ref.rollout.multi_turn.isolation=none to run model-written code unisolated")


@dataclass(frozen=True)
class Runtime:
    """The host paths the sandbox shows: the interpreter binary, its standard library and libpython."""

    interpreter: str
    stdlib: str
    libpython: str | None

    @classmethod
    def current(cls) -> Runtime:
        # The real binary, not the venv's link to it: the sandbox must not see the venv (its
        # site-packages hold the project and every installed package).
        interpreter = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
        stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
        libdir, soname = sysconfig.get_config_var("LIBDIR"), sysconfig.get_config_var("INSTSONAME")
        libpython = os.path.join(libdir, soname) if libdir and soname and ".so" in soname else None
        if libpython and not os.path.exists(libpython):  # a static build
            libpython = None
        return cls(interpreter, stdlib, os.path.realpath(libpython) if libpython else None)


def _system_library_mounts() -> list[str]:
    args: list[str] = []
    for path in SYSTEM_LIBRARIES:
        if os.path.islink(path):  # merged /usr: /lib -> usr/lib
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    if os.path.isfile("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    return args


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


def _reachable_by_others(path: str) -> bool:
    """Whether a user other than the owner can reach and read ``path`` (every parent searchable)."""
    parts = Path(path).parents
    return all(os.stat(p).st_mode & stat.S_IXOTH for p in parts) and bool(os.stat(path).st_mode & stat.S_IROTH)


def _link_or_copy(source: str, dest: str) -> None:
    try:
        os.link(source, dest)
    except OSError:  # another file system
        shutil.copy2(source, dest)


def _shared_copy(runtime: Runtime) -> Runtime:
    """For root, whose Python often lives under /root (mode 700, which nobody cannot search): a
    hard-linked (else copied) view of the runtime in a root-owned folder that everyone can read,
    made once per interpreter build and reused."""
    built = os.stat(runtime.interpreter)
    key = hashlib.sha256(f"{runtime}|{built.st_mtime_ns}|{built.st_size}".encode()).hexdigest()[:16]
    home = Path(SHARED_RUNTIMES) / key
    copy = Runtime(str(home / "python"), str(home / "stdlib"), str(home / "libpython") if runtime.libpython else None)
    if home.is_dir():
        return copy
    Path(SHARED_RUNTIMES).mkdir(parents=True, exist_ok=True, mode=0o755)
    os.chmod(SHARED_RUNTIMES, 0o755)
    tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=SHARED_RUNTIMES))
    try:
        _link_or_copy(runtime.interpreter, str(tmp / "python"))
        if runtime.libpython:
            _link_or_copy(runtime.libpython, str(tmp / "libpython"))
        shutil.copytree(runtime.stdlib, tmp / "stdlib", copy_function=_link_or_copy, symlinks=True,
                        ignore=shutil.ignore_patterns(*STDLIB_LEFT_OUT))
        os.chmod(tmp, 0o755)
        os.rename(tmp, home)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if not home.is_dir():  # not a lost race with another process making the same copy
            raise
    return copy


def _runtime_mounts(runtime: Runtime) -> list[str]:
    """Bind the interpreter, stdlib and libpython at their own paths (the interpreter finds its
    stdlib and libpython by them), from root's shared copy when nobody could not reach them."""
    sources = runtime
    if os.geteuid() == 0 and not all(_reachable_by_others(p) for p in (runtime.interpreter, runtime.libpython)
                                     if p is not None):
        sources = _shared_copy(runtime)
    pairs = [(sources.interpreter, runtime.interpreter), (sources.stdlib, runtime.stdlib)]
    if runtime.libpython and sources.libpython:
        pairs.append((sources.libpython, runtime.libpython))
    args: list[str] = []
    for source, dest in pairs:
        # under /usr/lib already for a system Python; a pyenv / uv / conda one lives elsewhere
        if source != dest or not any(dest.startswith(lib + os.sep) for lib in _library_dirs()):
            args += ["--ro-bind", source, dest]
    return args + [arg for name in STDLIB_LEFT_OUT if os.path.isdir(os.path.join(sources.stdlib, name))
                   for arg in ("--tmpfs", os.path.join(runtime.stdlib, name))]


def _library_dirs() -> list[str]:
    return [lib for lib in SYSTEM_LIBRARIES if os.path.isdir(lib) and not os.path.islink(lib)]


def sandbox_command(runtime: Runtime, argv: list[str]) -> list[str]:
    """The bwrap command line running ``argv`` (argv[0] is the interpreter) in a sandbox."""
    return [bwrap_path() or "bwrap", "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session",
            "--hostname", "sandbox", "--clearenv",
            "--setenv", "HOME", "/tmp", "--setenv", "TMPDIR", "/tmp", "--setenv", "LANG", "C.UTF-8",
            "--setenv", "PATH", "/usr/bin:/bin", *_system_library_mounts(), *_runtime_mounts(runtime),
            "--proc", "/proc", "--dev", "/dev", "--size", str(SCRATCH_BYTES), "--tmpfs", "/tmp",
            "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
            # the root and /dev are tmpfs without a size: read-only, so that only the sized ones take writes
            "--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--", *argv]


def popen_identity() -> dict[str, object]:
    """Popen keywords that drop root to nobody before bwrap starts (nothing for other users)."""
    if os.geteuid() != 0:
        return {}
    return {"user": NOBODY, "group": NOBODY, "extra_groups": []}


def _userns_hint() -> str:
    for path, bad in (("/proc/sys/kernel/unprivileged_userns_clone", "0"), ("/proc/sys/user/max_user_namespaces", "0"),
                      ("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "1")):
        try:
            if Path(path).read_text().strip() == bad:
                return f" ({path.removeprefix('/proc/sys/').replace('/', '.')} = {bad})"
        except OSError:
            continue
    return ""


@functools.cache
def isolation_problem() -> str | None:
    """Why the bwrap sandbox cannot run here (one line naming the fix), or None when it can:
    it starts the sandbox once (cached per process) and checks that Python runs inside."""
    if bwrap_path() is None:
        return f"the python tool runs model-written code in bubblewrap, which is not installed: {FIX_BWRAP}"
    runtime = Runtime.current()
    try:
        command = sandbox_command(runtime, [runtime.interpreter, "-I", "-S", "-c", "print('ok')"])
    except OSError as exc:  # e.g. root's shared copy of the runtime could not be made
        return f"the python tool's sandbox could not be prepared ({exc}): {FIX_BWRAP}"
    try:
        done = subprocess.run(command, capture_output=True, timeout=30, env=BWRAP_ENV, **popen_identity())
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the python tool's bubblewrap sandbox did not start ({type(exc).__name__}: {exc}): {FIX_BWRAP}"
    if done.returncode == 0 and done.stdout == b"ok\n":
        return None
    said = (done.stderr.decode(errors="replace").strip().splitlines() or ["no message"])[-1]
    if "namespace" in said or "Operation not permitted" in said or "Permission denied" in said:
        return f"the python tool's bubblewrap sandbox cannot start ({said}){_userns_hint()}: {FIX_USERNS}"
    return f"the python tool's bubblewrap sandbox cannot run Python ({said}): {FIX_BWRAP}"
