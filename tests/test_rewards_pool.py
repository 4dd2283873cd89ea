"""The scoring worker pool: results, errors, timeouts, crashes, clean-up; and the light import.

Worker-side functions are stdlib ones (``time.sleep``, ``os.getpid``, ``operator.truediv``) so
the workers import nothing from the test suite.
"""

from __future__ import annotations

import operator
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from alignctl.rewards.pool import CallResult, ScoringPool

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def pool() -> Iterator[ScoringPool]:
    with ScoringPool(max_workers=2) as p:
        p.warm_up()
        yield p


def test_results_come_back_in_order(pool: ScoringPool) -> None:
    results = pool.map(operator.add, [(i, 10) for i in range(6)], timeout_s=10.0)
    assert [r.value for r in results] == [10, 11, 12, 13, 14, 15]
    assert all(r.ok for r in results)
    assert pool.call(os.getpid, (), 10.0).value != os.getpid()


def test_exceptions_are_reraised_and_the_worker_survives(pool: ScoringPool) -> None:
    pid_before = {pool.call(os.getpid, (), 10.0).value for _ in range(4)}
    with pytest.raises(ZeroDivisionError) as info:
        pool.call(operator.truediv, (1, 0), 10.0)
    assert any("in reward worker process" in note for note in getattr(info.value, "__notes__", []))
    pid_after = {pool.call(os.getpid, (), 10.0).value for _ in range(4)}
    assert pid_after <= pid_before  # no worker was replaced


def test_timeout_kills_and_replaces_the_worker(pool: ScoringPool) -> None:
    start = time.monotonic()
    result = pool.call(time.sleep, (60,), timeout_s=0.5)
    assert result == CallResult(timed_out=True)
    assert time.monotonic() - start < 1.5
    pool.warm_up()
    assert pool.call(operator.mul, (6, 7), 10.0).value == 42


def test_a_dying_worker_is_a_crash_not_an_exception(pool: ScoringPool) -> None:
    assert pool.call(os._exit, (3,), 10.0) == CallResult(crashed=True)
    pool.warm_up()
    assert pool.call(operator.add, (1, 2), 10.0).value == 3


def test_a_worker_that_died_while_idle_is_replaced_before_use(pool: ScoringPool) -> None:
    pool.warm_up()
    pids = {pool.call(os.getpid, (), 10.0).value for _ in range(6)}
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    time.sleep(0.2)
    results = pool.map(operator.add, [(1, 2), (3, 4)], 10.0)
    assert [r.value for r in results] == [3, 7]
    assert {pool.call(os.getpid, (), 10.0).value for _ in range(6)}.isdisjoint(pids)


def test_start_up_failure_is_raised_to_the_caller() -> None:
    with ScoringPool(max_workers=1, preload=("no_such_module_xyz",)) as broken:
        with pytest.raises(ModuleNotFoundError, match="no_such_module_xyz"):
            broken.call(os.getpid, (), 10.0)


def _process_gone(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "State:\tZ" in status  # a zombie waiting for a reaper has stopped running


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux-only")
def test_workers_die_with_a_killed_parent() -> None:
    script = textwrap.dedent(
        """
        import os, time
        from alignctl.rewards.pool import ScoringPool
        pool = ScoringPool(max_workers=1)
        print(pool.call(os.getpid, (), 30.0).value, flush=True)
        pool.call(time.sleep, (600,), 600.0)   # the worker is busy when the parent is killed
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    assert parent.stdout is not None
    worker_pid = int(parent.stdout.readline())
    assert not _process_gone(worker_pid)
    time.sleep(0.2)  # let the sleep call reach the worker
    parent.kill()  # SIGKILL: no atexit, no clean-up code runs in the parent
    parent.wait()
    deadline = time.monotonic() + 5.0
    while not _process_gone(worker_pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _process_gone(worker_pid)


def test_import_alignctl_rewards_stays_light() -> None:
    heavy = ("torch", "transformers", "ray", "vllm", "deepspeed", "math_verify", "sympy")
    code = (
        "import sys, alignctl.rewards, alignctl.rewards.math_scorer, alignctl.rewards.managers;"
        f"print([m for m in {heavy!r} if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "[]"
