"""``alignctl run`` and ``alignctl status``: run a pipeline's stages in order, reusing every
artifact whose key is unchanged, rebuilding a changed stage and everything downstream of it."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignctl.config.core import seed_settings, to_dict
from alignctl.console import console
from alignctl.errors import UserError
from alignctl.pipeline.cache import (StageState, artifact_dir, check_workdir, clear, stage_keys, stage_state,
                                     typed_config, workdir_lock)
from alignctl.pipeline.manifest import write_manifest
from alignctl.pipeline.spec import PipelineSpec, load_pipeline, substitute
from alignctl.preflight import preflight
from alignctl.pipeline.stages import STAGE_KINDS


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
    console.rule(f"[bold]{name}[/] ({stage.kind})")
    if seeds := seed_settings(cfg):
        console.print(f"{name} seeds: {', '.join(seeds)}")
    start = time.perf_counter()
    metrics = STAGE_KINDS[stage.kind].run(cfg)
    seconds = time.perf_counter() - start
    folder.mkdir(parents=True, exist_ok=True)
    write_manifest(folder, stage=stage.kind, config=to_dict(cfg), key=key, metrics=metrics, wall_time_s=seconds,
                   inputs={up: paths[up] for up in stage.upstream}, extra={"name": name})
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
    except UserError as exc:
        raise UserError(f"{spec.path} (stage {name!r}): {exc}") from None


def run_pipeline(spec: PipelineSpec, *, force: list[str] | None = None, until: str | None = None,
                 dry_run: bool = False) -> list[StageOutcome]:
    force = force or []
    _check_names(spec, force + ([until] if until else []), "--force/--until")
    keys = stage_keys(spec)  # resolves and validates every stage's config before anything runs
    forced = _downstream(spec, set(force))
    paths = {name: str(artifact_dir(spec, name, key)) for name, key in keys.items()}
    check_workdir(spec.workdir, _external_inputs(spec, paths))
    states = {name: stage_state(spec, name, key) for name, key in keys.items()}
    to_run = list(spec.stages)[: list(spec.stages).index(until) + 1] if until else list(spec.stages)
    _preflight_all(spec, paths, {n for n, st in states.items() if st.state != "cached" or n in forced}, to_run,
                   offline_ok=dry_run)
    outcomes: list[StageOutcome] = []
    if dry_run:
        for name, key in keys.items():
            state = states[name]
            outcomes.append(StageOutcome(name, spec.stages[name].kind, f"planned ({state.state})", state.path, key))
        return outcomes
    with workdir_lock(spec.workdir):
        for name, key in keys.items():
            state = stage_state(spec, name, key)
            if state.state == "cached" and name not in forced:
                console.print(f"[green]cached[/] {name} -> {state.path}")
                outcomes.append(StageOutcome(name, spec.stages[name].kind, "cached", state.path, key,
                                             metrics=state.manifest.get("metrics", {})))
            else:
                outcomes.append(_run_stage(spec, name, key, paths))
            if name == until:
                break
    return outcomes


def pipeline_status(spec: PipelineSpec) -> list[StageState]:
    keys = stage_keys(spec)
    return [stage_state(spec, name, key) for name, key in keys.items()]
