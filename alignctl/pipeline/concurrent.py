"""Stages side by side: a pipeline stage with ``cpu_share`` below 1 runs in a process of its own, held
to its share of the cores, beside other stages whose inputs are built and whose shares fit.

Why: on a few CPU cores one stage uses them poorly. torch splits every small matrix product of a
decode step or a micro-batch over its threads, with a cost per split: on 2 cores, a SmolLM2 rollout
took 7.8 s on 2 threads and 11.5 s on 1 thread while a second 1-thread process ran the same on the
other core (a training pass 12.9 s against 18.4 s). Two independent stages on one core each are
done sooner than the two one after the other on both cores (``make -j``, Snakemake's ``threads``).

Numbers stay reproducible: a stage's cores (hence its torch threads and their reduction order) follow
from its share and the cores alignctl may use, never from which stages happen to run beside it; only
when stages start and end depends on timing. Each stage process writes its console output to
``<workdir>/logs/<stage>-<key12>.log``; this process shows which stages run and prints each one's
headline as it ends. A stage that fails stops the others (they leave no artifact: a stage folder is
complete only with its manifest) and its error line is the run's. A stage with share 1 runs alone,
in this process, exactly as ``alignctl run --sequential`` runs it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.progress import Progress

from alignctl.console import console, running_lines
from alignctl.cores import available_core_ids
from alignctl.errors import RunFailed, UserError
from alignctl.pipeline.ownership import is_empty_dir, is_owned, mark_owned
from alignctl.tracking import STEP_LINE_START, duration_text

LOG_FOLDER = "logs"
_STOP_WAIT_S = 20.0
_PLAIN_EVERY_S = 60.0  # a plain progress line this often when the spinner lines are off
_TAIL_BYTES = 8192  # of a stage's log, read for its latest step line


@dataclass(frozen=True)
class Job:
    """A stage waiting to run: its cores and the stages it reads."""

    name: str
    cores: int
    upstream: tuple[str, ...]


def stage_cores(share: float, total: int) -> int:
    """Whole cores for a share of ``total``: rounded down, at least 1, at most ``total``."""
    return max(1, min(total, int(share * total + 1e-9)))


def next_job(pending: list[Job], built: set[str], free: int) -> Job | None:
    """The first job in run order whose inputs are all built and whose cores are free (a later job
    may start before an earlier one that does not fit yet)."""
    for job in pending:
        if job.cores <= free and all(up in built for up in job.upstream):
            return job
    return None


def simulate(jobs: list[Job], seconds: dict[str, float], cores: int) -> dict[str, tuple[float, float]]:
    """(start, end) of each job when :func:`run_jobs` picks with :func:`next_job` and each job takes
    ``seconds[name]``: an event-by-event replay of the loop, no processes (``alignctl run --dry-run``)."""
    pending, running, built, times, now, free = list(jobs), [], set(), {}, 0.0, cores
    while pending or running:
        job = next_job(pending, built, free)
        if job is not None:
            pending.remove(job)
            times[job.name], free = (now, now + seconds[job.name]), free - job.cores
            running.append((now + seconds[job.name], job))
            continue
        running.sort(key=lambda item: item[0])
        now, done = running.pop(0)
        built.add(done.name)
        free += done.cores
    return times


@dataclass
class _Running:
    job: Job
    cores: list[int]
    process: subprocess.Popen[bytes]
    log: Path


def log_folder(workdir: Path) -> Path:
    """``<workdir>/logs``, created and marked as alignctl's; a folder of the user's there is refused."""
    folder = workdir / LOG_FOLDER
    if folder.exists() and not (folder.is_dir() and (is_empty_dir(folder) or is_owned(folder))):
        raise UserError(f"{folder}: exists and was not created by alignctl; refusing to write stage logs into it "
                        f"(move it, or choose a new workdir)")
    folder.mkdir(parents=True, exist_ok=True)
    if not is_owned(folder):
        mark_owned(folder, "pipeline stage logs")
    return folder


def stage_command(pipeline: Path, overrides: list[str], name: str, cores: list[int]) -> list[str]:
    """The command line of one stage process (the hidden ``alignctl _stage`` command)."""
    return [sys.executable, "-m", "alignctl", "_stage", str(pipeline), name,
            "--cores", ",".join(map(str, cores)), *overrides]


def run_jobs(jobs: list[Job], built: set[str], launch: Callable[[Job, list[int]], _Running],
             finished: Callable[[Job], None], run_here: Callable[[Job], None] | None = None,
             poll_s: float = 0.5) -> None:
    """Run ``jobs`` as cores free up: ``launch`` starts one in a process of its own on the given core
    ids; a job that takes every core runs alone, through ``run_here`` in this process when given (as
    ``--sequential`` would run it: no process start-up, the warm heap). ``finished`` is called for
    each job built. A failing job stops the others and raises."""
    free = available_core_ids()
    every_core = len(free)
    pending, running = list(jobs), []
    bars = running_lines()
    ticker = _Ticker()
    termination = _Termination()
    termination.catch()
    try:
        while pending or running:
            termination.check()
            job = next_job(pending, built, len(free))
            if job is not None and run_here is not None and job.cores == every_core:
                pending.remove(job)  # nothing runs beside it: every core is free
                termination.release()
                run_here(job)
                termination.catch()
                built.add(job.name)
                finished(job)
                continue
            while job is not None:
                cores, free = free[: job.cores], free[job.cores:]
                running.append(launch(job, cores))
                pending.remove(job)
                bars.start()
                bars.add_task(job.name, total=None, stage=job.name)
                job = next_job(pending, built, len(free))
            if not running:
                raise RunFailed(f"stages {[j.name for j in pending]} can never start: their inputs are not built")
            time.sleep(poll_s)
            termination.check()
            ticker.show(running, bars)
            for item in [r for r in running if r.process.poll() is not None]:
                running.remove(item)
                free = sorted(free + item.cores)
                _drop_bar(bars, item.job.name)
                if not running:
                    bars.stop()
                if item.process.returncode != 0:
                    raise _failure(item)
                built.add(item.job.name)
                finished(item.job)
    finally:
        bars.stop()
        _stop(running)
        termination.release()


class _Termination:
    """SIGTERM / SIGHUP while stage processes run: noted by the handler, acted on by the loop (``check``),
    which then leaves through its ``finally`` and stops them. Python's default would end this process at
    once and leave them running; raising from the handler could land between starting a process and
    recording it. Off (the old handlers back) while a stage runs in this process, which the signal then
    ends as it would end ``--sequential``."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.previous: dict[signal.Signals, Any] = {}

    def catch(self) -> None:
        def note(signum: int, frame: object) -> None:
            self.signum = signum

        for sig in (signal.SIGTERM, signal.SIGHUP):
            try:
                self.previous[sig] = signal.signal(sig, note)
            except ValueError:  # not the main thread (an API caller's worker thread): handlers stay as they are
                break

    def release(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous = {}

    def check(self) -> None:
        if self.signum is not None:
            raise SystemExit(128 + self.signum)


def latest_step(log: Path) -> str | None:
    """``step 7/20 · ETA 6m40s`` from the last step line a stage process wrote to its log (its RL
    console sink, :func:`alignctl.tracking.step_line`), or None before its first step."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - _TAIL_BYTES))
            tail = handle.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        parts = [part.strip() for part in line.split(" · ")]
        if parts[0].startswith(STEP_LINE_START) and "/" in parts[0]:
            return " · ".join([parts[0], *(p for p in parts[1:] if p.startswith("ETA "))])
    return None


class _Ticker:
    """What the running stages are at: each spinner line shows its stage's latest step and ETA; when
    the spinners are off (output piped to a file, CI), a plain line every :data:`_PLAIN_EVERY_S`."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.next_plain = self.started + _PLAIN_EVERY_S

    def show(self, running: list[_Running], bars: Progress) -> None:
        steps = {item.job.name: latest_step(item.log) for item in running}
        for task in bars.tasks:
            where = steps.get(task.fields.get("stage", ""))
            bars.update(task.id, description=f"{task.fields.get('stage', '')}" + (f" · {where}" if where else ""))
        now = time.monotonic()
        if bars.disable and now >= self.next_plain:
            self.next_plain = now + _PLAIN_EVERY_S
            states = "; ".join(f"{name} {where or 'starting'}" for name, where in steps.items())
            console.print(f"running ({duration_text(now - self.started)}): {states}", markup=False)


def _drop_bar(bars: Progress, name: str) -> None:
    for task in bars.tasks:
        if task.fields.get("stage") == name:
            bars.remove_task(task.id)


def launcher(pipeline: Path, overrides: list[str], logs: Path, keys: dict[str, str]) -> Callable[[Job, list[int]], _Running]:
    def launch(job: Job, cores: list[int]) -> _Running:
        log = logs / f"{job.name}-{keys[job.name][:12]}.log"
        handle = log.open("wb")
        env = {**os.environ, "COLUMNS": os.environ.get("COLUMNS", "140")}
        process = subprocess.Popen(stage_command(pipeline, overrides, job.name, cores), stdout=handle,
                                   stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                   start_new_session=True)  # its own process group: stopped as one, Ray included
        handle.close()
        word = "core" if len(cores) == 1 else "cores"
        order = list(keys)  # every stage, in run order
        console.print(f"[cyan]started[/] {job.name} (stage {order.index(job.name) + 1} of {len(order)}) on "
                      f"{len(cores)} {word} (log: {log})")
        return _Running(job, cores, process, log)

    return launch


def _failure(item: _Running) -> Exception:
    """The stage's own last line (its one-line error) as this run's error, with the exit status it had."""
    lines = [line for line in item.log.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    last = lines[-1].strip() if lines else f"exit status {item.process.returncode}"
    last = last.removeprefix("error: ")
    message = f"stage {item.job.name!r} failed: {last} (log: {item.log})"
    return UserError(message) if item.process.returncode == UserError.exit_code else RunFailed(message)


def _stop(running: list[_Running]) -> None:
    """Stop stages still running (after a failure or Ctrl-C): their process groups, politely first."""
    for item in running:
        _signal_group(item.process, signal.SIGTERM)
    deadline = time.monotonic() + _STOP_WAIT_S
    for item in running:
        try:
            item.process.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal_group(item.process, signal.SIGKILL)
            item.process.wait()
        console.print(f"[yellow]stopped[/] {item.job.name} (log: {item.log})")


def _signal_group(process: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass
