"""What ``alignctl run --dry-run`` shows: the order stages run in, which run side by side, and how
long the run should take, from the wall times that earlier manifests of the same stages recorded.

The estimate replays the scheduler (:func:`alignctl.pipeline.concurrent.simulate`) with each stage's
last recorded time: the newest manifest among ``<workdir>/<stage>-*`` (an earlier config of the stage,
so a guide, not a promise). A stage without one counts as 0 s and is said to."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alignctl.console import clip
from alignctl.pipeline.concurrent import Job, simulate, stage_cores
from alignctl.pipeline.manifest import read_manifest
from alignctl.pipeline.spec import PipelineSpec
from alignctl.tracking import duration_text


def earlier_seconds(workdir: Path, name: str) -> float | None:
    """The wall time the newest complete artifact of stage ``name`` in ``workdir`` recorded."""
    best: tuple[float, float] | None = None
    for folder in workdir.glob(f"{name}-*"):
        manifest = read_manifest(folder)
        seconds = (manifest or {}).get("wall_time_s")
        if isinstance(seconds, (int, float)):
            mtime = (folder / "manifest.json").stat().st_mtime
            if best is None or mtime > best[0]:
                best = (mtime, float(seconds))
    return None if best is None else best[1]


def plan_lines(spec: PipelineSpec, states: dict[str, str], *, cores: int, sequential: bool,
               width: int = 80) -> list[str]:
    """The dry run's report. ``states``: stage -> cached | stale | missing | forced, in run order
    (the stages up to ``--until``)."""
    to_build = [name for name, state in states.items() if state != "cached"]
    seconds = {name: earlier_seconds(spec.workdir, name) for name in to_build}
    shares = {name: 1.0 if sequential else spec.stages[name].cpu_share for name in to_build}
    jobs = [Job(name, stage_cores(shares[name], cores), tuple(u for u in spec.stages[name].upstream if u in to_build))
            for name in to_build]
    times = simulate(jobs, {name: seconds[name] or 0.0 for name in to_build}, cores)
    known = [name for name in to_build if seconds[name] is not None]
    # Who runs beside whom depends on the times; without all of them, the replay assumes equal ones.
    overlap = times if len(known) == len(to_build) else simulate(jobs, {name: 1.0 for name in to_build}, cores)
    name_w = max([5, *(len(n) for n in states)])
    kind_w = max([4, *(len(spec.stages[n].kind) for n in states)])
    lines = [clip(f"dry run on {cores} core{'s' if cores != 1 else ''}: {len(states)} stages, "
                  f"{len(states) - len(to_build)} cached, {len(to_build)} to run ({spec.path})", width),
             f" #  {'stage':<{name_w}}  {'kind':<{kind_w}}  {'state':<7}  cores  {'time':>6}  beside"]
    for index, (name, state) in enumerate(states.items(), 1):
        row = f"{index:>2}  {name:<{name_w}}  {spec.stages[name].kind:<{kind_w}}  {state:<7}"
        if name in times:
            took = duration_text(seconds[name]) if seconds[name] is not None else "?"
            row += f"  {next(j.cores for j in jobs if j.name == name):>5}  {took:>6}  {', '.join(_beside(name, overlap))}"
        lines.append(clip(row.rstrip(), width))
    if to_build:
        total = max(end for _, end in times.values())
        missing = len(to_build) - len(known)
        note = "from the stages' earlier manifests in the workdir" if known else "no earlier manifests in the workdir"
        if known and missing:
            note += f"; {missing} stage{'s' if missing > 1 else ''} without one counted as 0 s"
        if len(known) < len(to_build) and any(_beside(name, overlap) for name in to_build):
            note += "; 'beside' assumes equal stage times"
        lines.append(clip(f"estimate: {duration_text(total) if known else 'unknown'} ({note})", width))
    return lines


def _beside(name: str, times: dict[str, tuple[float, float]]) -> list[str]:
    """The stages whose run overlaps ``name``'s in the replay (zero-length runs overlap nothing)."""
    start, end = times[name]
    return [other for other, (s, e) in times.items() if other != name and s < end and start < e]


def dry_run_states(outcomes: list[Any]) -> dict[str, str]:
    """stage -> state from run_pipeline's dry-run outcomes ('planned (stale)' -> 'stale')."""
    return {o.name: o.state.removeprefix("planned (").removesuffix(")") for o in outcomes}
