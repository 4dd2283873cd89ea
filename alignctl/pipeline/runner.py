"""``alignctl run`` and ``alignctl status``: run a pipeline's stages in order, reusing every
artifact whose key is unchanged, rebuilding a changed stage and everything downstream of it.

Stages run one after the other in this process, each on every core, unless a stage to run has a
``cpu_share`` below 1: then those stages get processes of their own and run side by side as their
cores fit, while a stage that takes every core still runs alone in this process
(``pipeline/concurrent.py``); ``sequential=True`` (``alignctl run --sequential``) keeps
the one-process order whatever the shares say."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignctl.config.core import seed_settings, to_dict
from alignctl.console import console
from alignctl.cores import available_cores
from alignctl.errors import UserError
from alignctl.pipeline import concurrent
from alignctl.pipeline.cache import (StageState, artifact_dir, check_workdir, clear, stage_keys, stage_state,
                                     typed_config, workdir_lock)
from alignctl.pipeline.manifest import read_manifest, write_manifest
from alignctl.pipeline.spec import PipelineSpec, load_pipeline, substitute
from alignctl.preflight import preflight
from alignctl.pipeline.stages import STAGE_KINDS
from alignctl.pipeline.summary import headline
from alignctl.tracking import check_logger_packages


@dataclass
class StageOutcome:
    name: str
    kind: str
    state: str  # ran | cached | planned
    path: Path
    key: str
    seconds: float = 0.0
    metrics: dict[str, Any] = field(default_factory=dict)


def load(path: str | Path, overrides: list[str]) -> PipelineSpec:
    return load_pipeline(path, overrides, set(STAGE_KINDS))


def _downstream(spec: PipelineSpec, roots: set[str]) -> set[str]:
    """The named stages and every stage that (transitively) reads them."""
    marked = set(roots)
    for name, stage in spec.stages.items():  # topological order: upstream marks come first
        if marked & set(stage.upstream):
            marked.add(name)
    return marked


def _check_names(spec: PipelineSpec, names: list[str], flag: str) -> None:
    for name in names:
        if name not in spec.stages:
            raise UserError(f"{flag} {name!r}: no such stage in {spec.path}; stages: {', '.join(spec.stages)}")


def _run_stage(spec: PipelineSpec, name: str, key: str, paths: dict[str, str]) -> StageOutcome:
    stage = spec.stages[name]
    folder = artifact_dir(spec, name, key)
    cfg = typed_config(stage, paths, str(folder), spec.path)
    _stage_preflight(spec, name, cfg)  # every input exists now: the full check, before the folder is touched
    clear(folder)  # an incomplete previous attempt (no manifest) is never reused
    order = list(spec.stages)
    console.rule(f"[bold]{name}[/] ({stage.kind}) · stage {order.index(name) + 1} of {len(order)}")
    if seeds := seed_settings(cfg):
        console.print(f"{name} seeds: {', '.join(seeds)}")
    start = time.perf_counter()
    metrics = STAGE_KINDS[stage.kind].run(cfg)
    seconds = time.perf_counter() - start
    folder.mkdir(parents=True, exist_ok=True)
    write_manifest(folder, stage=stage.kind, config=to_dict(cfg), key=key, metrics=metrics, wall_time_s=seconds,
                   inputs={up: paths[up] for up in stage.upstream},
                   extra={"name": name, "cpu_cores": available_cores()})  # threads set the float rounding
    return StageOutcome(name, stage.kind, "ran", folder, key, seconds, metrics)


def _external_inputs(spec: PipelineSpec, paths: dict[str, str]) -> list[str]:
    """Existing files and folders the stages read that no stage writes (the user's inputs)."""
    artifacts = [Path(p).absolute() for p in paths.values()]
    found: list[str] = []

    def walk(value: Any) -> None:
        if isinstance(value, dict):
            for item in value.values():
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)
        elif isinstance(value, str) and value.strip() and Path(value).expanduser().exists():
            path = Path(value).expanduser().absolute()
            if not any(path == a or a in path.parents for a in artifacts):
                found.append(value)

    for stage in spec.stages.values():
        walk(substitute(stage.config, paths))
    return found


def _preflight_all(spec: PipelineSpec, paths: dict[str, str], to_build: set[str], to_run: list[str], *,
                   offline_ok: bool) -> None:
    """Check every stage before the first one runs: inputs that an upstream stage will build are
    taken on trust until that stage has run (each stage is checked in full again just before it
    starts)."""
    pending = [paths[name] for name in to_build]
    for name in to_run:
        cfg = typed_config(spec.stages[name], paths, paths[name], spec.path)
        _stage_preflight(spec, name, cfg, pending, offline_ok=offline_ok)


def _stage_preflight(spec: PipelineSpec, name: str, cfg: Any, pending: list[str] | None = None, *,
                     offline_ok: bool = False) -> None:
    try:
        preflight(cfg, pending=pending or (), outputs=False, offline_ok=offline_ok)
        trainer = getattr(cfg, "trainer", None)
        if isinstance(getattr(trainer, "logger", None), list):  # RL stages
            check_logger_packages(trainer.logger)
    except UserError as exc:
        raise UserError(f"{spec.path} (stage {name!r}): {exc}") from None


def run_pipeline(spec: PipelineSpec, *, force: list[str] | None = None, until: str | None = None,
                 dry_run: bool = False, sequential: bool = False) -> list[StageOutcome]:
    force = force or []
    _check_names(spec, force + ([until] if until else []), "--force/--until")
    keys = stage_keys(spec)  # resolves and validates every stage's config before anything runs
    forced = _downstream(spec, set(force))
    paths = {name: str(artifact_dir(spec, name, key)) for name, key in keys.items()}
    check_workdir(spec.workdir, _external_inputs(spec, paths))
    states = {name: stage_state(spec, name, key) for name, key in keys.items()}
    to_run = list(spec.stages)[: list(spec.stages).index(until) + 1] if until else list(spec.stages)
    to_build = {n for n, st in states.items() if st.state != "cached" or n in forced}
    # A cached stage will not run: its inputs need no check (and a warm dry run stays quick).
    _preflight_all(spec, paths, to_build, [n for n in to_run if n in to_build], offline_ok=dry_run)
    outcomes: list[StageOutcome] = []
    if dry_run:
        for name in to_run:
            state = "forced" if name in forced else states[name].state
            outcomes.append(StageOutcome(name, spec.stages[name].kind, f"planned ({state})", states[name].path,
                                         keys[name]))
        return outcomes
    with workdir_lock(spec.workdir):
        fresh = {n: stage_state(spec, n, keys[n]) for n in to_run}
        to_build = [n for n in to_run if fresh[n].state != "cached" or n in forced]
        if not sequential and any(spec.stages[n].cpu_share < 1.0 for n in to_build):
            return _run_side_by_side(spec, keys, paths, fresh, to_build)
        for name, key in keys.items():
            state = fresh[name]  # to_run holds every stage up to --until, where the loop stops
            if state.state == "cached" and name not in forced:
                outcomes.append(_cached_outcome(spec, state))
            else:
                outcomes.append(_run_stage(spec, name, key, paths))
            if name == until:
                break
    return outcomes


def _run_side_by_side(spec: PipelineSpec, keys: dict[str, str], paths: dict[str, str],
                      states: dict[str, StageState], to_build: list[str]) -> list[StageOutcome]:
    """Stages with a share below 1 in processes of their own, independent ones at once as their shares
    fit; a stage that takes every core alone in this process. ``states``: every stage to run."""
    outcomes = {name: _cached_outcome(spec, state) for name, state in states.items() if name not in to_build}
    total = available_cores()
    jobs = [concurrent.Job(name, concurrent.stage_cores(spec.stages[name].cpu_share, total),
                           tuple(up for up in spec.stages[name].upstream if up in to_build)) for name in to_build]

    def finished(job: concurrent.Job) -> None:
        if job.name in outcomes:  # ran in this process: it printed its own report
            return
        folder = Path(paths[job.name])
        manifest = read_manifest(folder) or {}
        outcome = StageOutcome(job.name, spec.stages[job.name].kind, "ran", folder, keys[job.name],
                               float(manifest.get("wall_time_s", 0.0)), manifest.get("metrics", {}))
        outcomes[job.name] = outcome
        console.print(f"[green]finished[/] {job.name} in {outcome.seconds:.1f}s: "
                      f"{headline(outcome.kind, outcome.metrics)}")

    def run_here(job: concurrent.Job) -> None:
        outcomes[job.name] = _run_stage(spec, job.name, keys[job.name], paths)

    logs = concurrent.log_folder(spec.workdir)
    launch = concurrent.launcher(spec.path, spec.overrides, logs, keys)
    concurrent.run_jobs(jobs, set(), launch, finished, run_here)
    return [outcomes[name] for name in states]


def _cached_outcome(spec: PipelineSpec, state: StageState) -> StageOutcome:
    """A cached stage's outcome, announced as the run passes it."""
    console.print(f"[green]cached[/] {state.name} -> {state.path}")
    return StageOutcome(state.name, spec.stages[state.name].kind, "cached", state.path, state.key,
                        metrics=(state.manifest or {}).get("metrics", {}))


def run_one_stage(spec: PipelineSpec, name: str) -> StageOutcome:
    """One stage of a pipeline whose other stages are built or being built (a stage process of
    ``_run_side_by_side``, whose parent holds the workdir lock): build it even if cached."""
    _check_names(spec, [name], "stage")
    keys = stage_keys(spec)
    paths = {n: str(artifact_dir(spec, n, key)) for n, key in keys.items()}
    return _run_stage(spec, name, keys[name], paths)


def pipeline_status(spec: PipelineSpec) -> list[StageState]:
    keys = stage_keys(spec)
    return [stage_state(spec, name, key) for name, key in keys.items()]
