"""Content-addressed stage artifacts: keys, folders, states, and the workdir lock.

key = sha256(stage kind + kind format version + the canonical *resolved* stage config, where each
reference to an upstream stage is replaced by that stage's key; settings marked ``same_result``,
which change how a stage runs and not what it produces, are left out). A folder is reused only when its
``manifest.json`` exists (written last) and records the same key; anything else is rebuilt.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import filelock

from alignctl.config.core import ConfigErrors, build_config, merge_dicts, result_dict
from alignctl.errors import UserError
from alignctl.pipeline.manifest import read_manifest
from alignctl.pipeline.ownership import check_replaceable, is_empty_dir, is_owned, mark_owned, protected_reason
from alignctl.pipeline.spec import PipelineSpec, StageSpec, substitute
from alignctl.pipeline.stages import KIND_DEFAULTS, STAGE_KINDS

CACHE_FORMAT = 1
_OUTPUT_PLACEHOLDER = "<artifact>"
LOCK_FILE = ".alignctl.lock"  # held by filelock (flock on POSIX, msvcrt on Windows) for a whole run
HOLDER_FILE = ".alignctl.lock.pid"  # the holder's pid, beside the lock: some lock backends truncate the lock file


def typed_config(stage: StageSpec, mapping: dict[str, str], output: str, source: Path) -> Any:
    """The stage's schema instance with references resolved through ``mapping``."""
    kind = STAGE_KINDS[stage.kind]
    data = merge_dicts(KIND_DEFAULTS.get(stage.kind, {}), substitute(stage.config, mapping))
    data = kind.with_output(data, Path(output))
    try:
        return build_config(kind.schema_class(), data, file=f"{source} (stage {stage.name!r})")
    except ConfigErrors as exc:
        raise exc.prefixed(f"{source} (stage {stage.name!r})") from None
    except UserError as exc:
        message = str(exc)
        prefix = f"{source} (stage {stage.name!r})"
        raise UserError(message if message.startswith(prefix) else f"{prefix}: {message}") from None


def stage_keys(spec: PipelineSpec) -> dict[str, str]:
    """Every stage's key, upstream first (keys depend only on configs, so nothing has to run). The
    config mistakes of every stage are raised together (:class:`ConfigErrors`), in run order."""
    keys: dict[str, str] = {}
    mistakes: list[str] = []
    for name, stage in spec.stages.items():
        placeholders = {up: f"<stage:{keys[up]}>" for up in stage.upstream}
        try:
            typed = typed_config(stage, placeholders, _OUTPUT_PLACEHOLDER, spec.path)
        except UserError as exc:
            mistakes += getattr(exc, "messages", None) or [str(exc)]
            keys[name] = "invalid"  # downstream stages are still checked
            continue
        kind = STAGE_KINDS[stage.kind]
        content: dict[str, Any] = {"kind": stage.kind, "kind_version": kind.version, "cache_format": CACHE_FORMAT,
                                   "config": result_dict(typed), "inputs": {up: keys[up] for up in stage.upstream}}
        if kind.sources is not None:
            content["sources"] = kind.sources(typed)
        payload = json.dumps(content, sort_keys=True, default=str)
        keys[name] = hashlib.sha256(payload.encode()).hexdigest()
    if mistakes:
        raise UserError(mistakes[0]) if len(mistakes) == 1 else ConfigErrors(mistakes)
    return keys


def artifact_dir(spec: PipelineSpec, name: str, key: str) -> Path:
    return spec.workdir / f"{name}-{key[:12]}"


@dataclass
class StageState:
    name: str
    key: str
    path: Path
    state: str  # cached | stale | missing
    manifest: dict[str, Any] | None


def stage_state(spec: PipelineSpec, name: str, key: str) -> StageState:
    path = artifact_dir(spec, name, key)
    manifest = read_manifest(path)
    if manifest is not None and manifest.get("key") == key:
        return StageState(name, key, path, "cached", manifest)
    older = [p for p in spec.workdir.glob(f"{name}-*") if p != path and (read_manifest(p) or {}).get("key")]
    return StageState(name, key, path, "stale" if older else "missing", None)


def clear(path: Path) -> None:
    """Remove an incomplete or forced artifact folder before its stage runs again (only one that
    alignctl wrote: a folder of the user's at that path is an error, never deleted)."""
    if path.exists():
        check_replaceable(path)
        shutil.rmtree(path)


def check_workdir(workdir: Path, inputs: list[str] | None = None) -> None:
    """A pipeline's workdir is new, empty, or an alignctl workdir: never a folder of the user's,
    the home or current folder, or a folder holding one of the stages' inputs."""
    reason = protected_reason(workdir.resolve(), inputs or ())
    if reason:
        raise UserError(f"workdir {workdir}: refusing to write stage folders there, it {reason}; choose a new "
                        f"workdir")
    if workdir.exists() and not (workdir.is_dir() and (is_empty_dir(workdir) or is_owned(workdir))):
        raise UserError(f"workdir {workdir}: exists and was not created by alignctl; refusing to write stage "
                        f"folders into it (choose a new workdir)")


@contextlib.contextmanager
def workdir_lock(workdir: Path) -> Iterator[None]:
    """Exclusive lock over a workdir: a second run waits, then finds the first one's artifacts."""
    check_workdir(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    if not is_owned(workdir):
        mark_owned(workdir, "pipeline workdir")
    lock = filelock.FileLock(workdir / LOCK_FILE)
    holder = workdir / HOLDER_FILE
    try:
        lock.acquire(timeout=0)
    except filelock.Timeout:
        print(f"waiting for {workdir} (locked by pid {_read_holder(holder)})", flush=True)
        lock.acquire()
    try:
        holder.write_text(str(os.getpid()), encoding="utf-8")
        yield
    finally:
        holder.unlink(missing_ok=True)
        lock.release()


def _read_holder(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip() or "another process"
    except OSError:
        return "another process"
