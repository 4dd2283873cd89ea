"""Persistent scoring processes with a hard per-call timeout.

Rule scorers run on text the policy wrote, and some inputs make them run for ever (sympy
evaluating ``9^{9^{9^{9}}}``, a regex on a 100 000-character answer). math-verify's own timeout
uses ``signal.alarm``: it only works in the main thread of the main interpreter, so not in a
thread pool, not in an async server, and not reliably inside Ray workers. A process is the only
thing that can be stopped from outside whatever it is doing, so each call runs in a worker
process; when the call overruns, the worker is killed (SIGKILL) and replaced.

Design:

- Workers are fresh interpreters (``subprocess`` + a socket pair), not forks: forking a process
  that already runs threads (Ray, torch, tokenizers) can deadlock the child on a lock held by a
  thread that does not exist there. Not multiprocessing's ``spawn`` either: it re-runs the
  caller's ``__main__`` file in every child, which breaks any script without a
  ``if __name__ == "__main__"`` guard.
- Workers are persistent and started lazily, up to ``max_workers``; a call checks one out, so
  ``call`` is thread-safe and concurrent calls run in parallel.
- The timeout clock starts when the task is handed to a ready worker: a worker's start-up
  (interpreter + imports, about a second) is not charged to the item.
- A worker that dies mid-call (segfault, out-of-memory kill) is a "crash": reported, not raised,
  because adversarial text can crash a C extension and that must not stop training.
- On Linux a worker asks the kernel to SIGKILL it when its parent dies (``PR_SET_PDEATHSIG``),
  so a killed Ray actor does not leave a worker spinning on ``9^{9^{9^{9}}}``. That signal follows
  the parent *thread*, so workers are started from one long-lived thread of this module.
"""

from __future__ import annotations

import atexit
import contextlib
import contextvars
import importlib
import os
import pickle
import queue
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

STARTUP_TIMEOUT_S = 120.0

_IN_WORKER = False


def in_worker() -> bool:
    """True inside a scoring worker process (scorers then run directly: the caller holds the timeout)."""
    return _IN_WORKER


# ---------------------------------------------------------------------------------------------
# Results and failure tallies
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallResult:
    """What one call produced: ``value`` when it finished, else ``timed_out`` or ``crashed``."""

    value: Any = None
    timed_out: bool = False
    crashed: bool = False

    @property
    def ok(self) -> bool:
        return not (self.timed_out or self.crashed)


@dataclass
class FailureTally:
    timeouts: int = 0
    crashes: int = 0


_ACTIVE_TALLIES: contextvars.ContextVar[tuple[FailureTally, ...]] = contextvars.ContextVar(
    "alignctl_reward_tallies", default=()
)
_TALLY_LOCK = threading.Lock()


def record_failure(result: CallResult, *extra: FailureTally) -> None:
    """Count a timed-out or crashed call in ``extra`` and in every ``collect_failures`` block
    active in this thread's context."""
    with _TALLY_LOCK:
        for tally in (*extra, *_ACTIVE_TALLIES.get()):
            tally.timeouts += int(result.timed_out)
            tally.crashes += int(result.crashed)


@contextlib.contextmanager
def collect_failures() -> Iterator[FailureTally]:
    """Count the scorer timeouts/crashes that happen in this thread inside the block (a reward
    manager uses it to learn how many of its in-process items a guarded scorer gave up on)."""
    tally = FailureTally()
    token = _ACTIVE_TALLIES.set((*_ACTIVE_TALLIES.get(), tally))
    try:
        yield tally
    finally:
        _ACTIVE_TALLIES.reset(token)


# ---------------------------------------------------------------------------------------------
# Worker side
# ---------------------------------------------------------------------------------------------


def _die_with_parent(parent_pid: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)


def _send_error(conn: Connection, exc: BaseException) -> None:
    import traceback

    exc.add_note("in reward worker process:\n" + "".join(traceback.format_exception(exc)))
    try:
        conn.send(("error", exc))
    except Exception:  # the exception itself does not pickle: keep its text
        conn.send(("error", RuntimeError(f"{type(exc).__name__}: {exc}")))


def _worker_setup(conn: Connection) -> None:
    """Read the start-up message, then import and warm what the pool asked for."""
    parent_pid, preload, warm, memory_limit_mb = conn.recv()
    _die_with_parent(parent_pid)
    if memory_limit_mb is not None:
        import resource

        limit = memory_limit_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    for module in preload:
        importlib.import_module(module)
    pickle.loads(warm)  # loads user files / imports the scorer before the first timed call


def worker_entry(fd: int) -> None:
    """Body of a worker process: ``python -c 'from alignctl.rewards.pool import worker_entry; ...'``."""
    global _IN_WORKER
    _IN_WORKER = True
    # Ctrl-C reaches the whole process group; the parent handles it and its exit ends us.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(fd)
    try:
        _worker_setup(conn)
    except BaseException as exc:
        _send_error(conn, exc)
        return
    conn.send(("ready", None))
    while True:
        try:
            fn, args = conn.recv()
        except (EOFError, OSError):  # the parent closed the socket or died
            return
        try:
            conn.send(("ok", fn(*args)))
        except BaseException as exc:
            _send_error(conn, exc)


# ---------------------------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------------------------


def _dumps_for_worker(obj: Any) -> bytes:
    try:
        return pickle.dumps(obj)
    except (pickle.PicklingError, AttributeError, TypeError) as exc:
        raise TypeError(
            f"cannot send a scorer to a reward worker process: {exc}. Use a module-level function "
            "or one returned by load_reward_function (lambdas and local functions do not pickle)."
        ) from exc


class _Spawner:
    """Starts processes from one long-lived daemon thread (see PR_SET_PDEATHSIG above)."""

    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]]
        self._queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self, launch: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name="alignctl-reward-spawner", daemon=True)
                self._thread.start()
        done: Future[subprocess.Popen[bytes]] = Future()
        self._queue.put((launch, done))
        return done.result()

    def _loop(self) -> None:
        while True:
            launch, done = self._queue.get()
            try:
                done.set_result(launch())
            except BaseException as exc:
                done.set_exception(exc)


_SPAWNER = _Spawner()
_LIVE: set[subprocess.Popen[bytes]] = set()
_LIVE_LOCK = threading.Lock()


@atexit.register
def _kill_all_workers() -> None:
    with _LIVE_LOCK:
        processes = list(_LIVE)
    for process in processes:
        process.kill()


def _worker_env() -> dict[str, str]:
    # The child must import alignctl (and the user's modules) exactly as this process does.
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


class _Worker:
    def __init__(self, preload: tuple[str, ...], warm: bytes, memory_limit_mb: int | None) -> None:
        ours, theirs = socket.socketpair()
        fd = theirs.fileno()
        code = f"from alignctl.rewards.pool import worker_entry; worker_entry({fd})"
        try:
            self.process = _SPAWNER.start(
                lambda: subprocess.Popen(
                    [sys.executable, "-c", code], pass_fds=(fd,), stdin=subprocess.DEVNULL, env=_worker_env()
                )
            )
        finally:
            theirs.close()
        with _LIVE_LOCK:
            _LIVE.add(self.process)
        self.conn = Connection(ours.detach())
        self.conn.send((os.getpid(), preload, warm, memory_limit_mb))
        self.ready = False

    def wait_ready(self) -> None:
        if self.ready:
            return
        if not self.conn.poll(STARTUP_TIMEOUT_S):
            raise RuntimeError(f"reward worker did not start within {STARTUP_TIMEOUT_S:.0f} s")
        try:
            kind, payload = self.conn.recv()
        except EOFError:
            raise RuntimeError(
                f"reward worker exited during start-up (exit code {self.process.wait()})"
            ) from None
        if kind == "error":
            raise payload
        self.ready = True

    def run(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> CallResult:
        payload_bytes = _dumps_for_worker((fn, args))
        try:
            self.conn.send_bytes(payload_bytes)
        except OSError:  # died between checkout and now
            return CallResult(crashed=True)
        if not self.conn.poll(timeout_s):
            return CallResult(timed_out=True)
        try:
            kind, payload = self.conn.recv()
        except (EOFError, OSError):
            return CallResult(crashed=True)
        if kind == "error":
            raise payload
        return CallResult(value=payload)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=5)
        self.conn.close()
        with _LIVE_LOCK:
            _LIVE.discard(self.process)


class ScoringPool:
    """Up to ``max_workers`` persistent worker processes; ``call`` runs ``fn(*args)`` in one of
    them and gives up after ``timeout_s`` seconds (the worker is then killed and replaced).

    ``preload``: modules every worker imports before it reports ready. ``warm``: objects pickled
    to every worker at start (unpickling a ``load_reward_function`` result loads the user's file
    there, so that cost is not charged to the first item). ``memory_limit_mb`` caps each worker's
    address space (an exploding sympy expression then fails with MemoryError instead of eating
    the machine). ``fn`` and ``args`` must pickle.
    """

    def __init__(
        self,
        max_workers: int,
        preload: Sequence[str] = (),
        warm: Sequence[Any] = (),
        memory_limit_mb: int | None = None,
    ) -> None:
        if max_workers < 1:
            raise ValueError(f"max_workers must be >= 1, got {max_workers}")
        self.max_workers = max_workers
        self._preload = tuple(preload)
        self._warm = _dumps_for_worker(tuple(warm))
        self._memory_limit_mb = memory_limit_mb
        self._idle: list[_Worker] = []
        self._alive = 0
        self._cond = threading.Condition()
        self._closed = False

    def _new_worker(self) -> _Worker:
        return _Worker(self._preload, self._warm, self._memory_limit_mb)

    def _checkout(self) -> _Worker:
        with self._cond:
            while True:
                if self._closed:
                    raise RuntimeError("ScoringPool is closed")
                for dead in [w for w in self._idle if w.process.poll() is not None]:
                    # Died while idle (OOM killer, someone's kill): replace, don't hand it out.
                    self._idle.remove(dead)
                    dead.kill()
                    self._alive -= 1
                if self._idle:
                    # Prefer a worker that has finished starting.
                    self._idle.sort(key=lambda w: not (w.ready or w.conn.poll(0)))
                    return self._idle.pop(0)
                if self._alive < self.max_workers:
                    self._alive += 1
                    break
                self._cond.wait()
        try:
            return self._new_worker()
        except BaseException:
            self._release(None)
            raise

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            if worker is None:
                self._alive -= 1
            elif self._closed:
                worker.kill()
                self._alive -= 1
            else:
                self._idle.append(worker)
            self._cond.notify()

    def _replace(self, worker: _Worker) -> _Worker | None:
        """Kill ``worker`` and start its successor now, so it warms up while the caller moves on."""
        worker.kill()
        try:
            return self._new_worker()
        except Exception:
            return None

    def call(self, fn: Callable[..., Any], args: tuple[Any, ...], timeout_s: float) -> CallResult:
        """Run ``fn(*args)`` in a worker. Exceptions raised by ``fn`` are re-raised here."""
        worker = self._checkout()
        try:
            worker.wait_ready()
        except BaseException:
            worker.kill()
            self._release(None)
            raise
        try:
            result = worker.run(fn, args, timeout_s)
        except BaseException:
            self._release(worker)  # the worker answered (with an error) and is still usable
            raise
        if result.ok:
            self._release(worker)
        else:
            self._release(self._replace(worker))
        return result

    def map(self, fn: Callable[..., Any], arg_list: Sequence[tuple[Any, ...]], timeout_s: float) -> list[CallResult]:
        """``call`` over ``arg_list`` with up to ``max_workers`` in flight; results in order."""
        if not arg_list:
            return []
        with ThreadPoolExecutor(max_workers=min(self.max_workers, len(arg_list))) as threads:
            return list(threads.map(lambda args: self.call(fn, args, timeout_s), arg_list))

    def warm_up(self) -> None:
        """Start every worker and wait until each is ready (used before timing-sensitive work)."""
        workers = [self._checkout() for _ in range(self.max_workers)]
        failure: BaseException | None = None
        for worker in workers:
            try:
                worker.wait_ready()
            except BaseException as exc:
                failure = failure or exc
                worker.kill()
                self._release(None)
            else:
                self._release(worker)
        if failure is not None:
            raise failure

    def close(self) -> None:
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            self._alive -= len(idle)
            self._cond.notify_all()
        for worker in idle:
            worker.kill()

    def __enter__(self) -> ScoringPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
