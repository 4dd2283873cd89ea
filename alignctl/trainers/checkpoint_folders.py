"""Controller-side checkpoints: one folder per saved step, committed atomically, the newest K kept.

    <run folder>/checkpoints/
        global_step_4/                 complete: renamed into place after every writer finished
            actor/                     worker state (alignctl.workers.checkpoint): weights, optimizer,
            critic/                      LR schedule, each rank's random state
            trainer_state.json         global step, data position, KL controller
            checkpoint_manifest.json   every file's size and sha256, HMAC-signed (written last)
        .partial-global_step_6/        an interrupted write: never read, removed at the next start
        latest_checkpointed_iteration.txt   the newest committed step (verl's file name), for people

A checkpoint is complete exactly when its ``global_step_N`` folder exists: the rename is the commit,
so a run killed at any moment leaves either the previous checkpoint or the new one, never half of one.

Worker state holds pickles, so a resume first checks the signed manifest
(:mod:`alignctl.trainers.checkpoint_trust`): a checkpoint this installation did not write, or one
changed since, is refused unless ``trainer.trust_checkpoint``.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from alignctl.console import console
from alignctl.data.readers import read_jsonl
from alignctl.errors import UserError
from alignctl.pipeline.atomic import atomic_write_text
from alignctl.trainers.checkpoint_trust import check_trusted, write_manifest

STEP_PREFIX = "global_step_"
PARTIAL_PREFIX = ".partial-"
STATE_FILE = "trainer_state.json"
LATEST_FILE = "latest_checkpointed_iteration.txt"
FORMAT_VERSION = 1


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def _step_of(name: str) -> int | None:
    suffix = name[len(STEP_PREFIX):] if name.startswith(STEP_PREFIX) else ""
    return int(suffix) if suffix.isdigit() else None


def complete_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """(step, folder) of every committed checkpoint under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(_step_of(p.name), p) for p in root.iterdir() if p.is_dir()]
    return sorted((step, p) for step, p in found if step is not None and (p / STATE_FILE).is_file())


def remove_partials(root: Path) -> None:
    """Drop folders of interrupted writes (a kill during a checkpoint)."""
    if root.is_dir():
        for path in root.iterdir():
            if path.name.startswith(PARTIAL_PREFIX):
                shutil.rmtree(path, ignore_errors=True)


def start_partial(root: Path, step: int) -> Path:
    """An empty folder for step ``step`` to be written into (not yet a checkpoint)."""
    partial = root / f"{PARTIAL_PREFIX}{STEP_PREFIX}{step}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def write_state(folder: Path, state: dict[str, Any]) -> None:
    (folder / STATE_FILE).write_text(json.dumps({"format": FORMAT_VERSION, **state}, indent=2), encoding="utf-8")


def read_state(folder: Path) -> dict[str, Any]:
    path = folder / STATE_FILE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path}: not a readable checkpoint state ({exc})") from exc
    if state.get("format") != FORMAT_VERSION:
        raise UserError(f"{path}: checkpoint format {state.get('format')!r}, this alignctl reads {FORMAT_VERSION}")
    return state


def commit(partial: Path, root: Path, step: int, keep: int | None) -> Path:
    """Rename ``partial`` into place as step ``step`` (the atomic commit), then prune old ones."""
    write_manifest(partial)  # inside the partial folder: the rename commits files and manifest together
    final = root / f"{STEP_PREFIX}{step}"
    if final.exists():  # the same step saved by an earlier run that started over (resume_mode=disable)
        shutil.rmtree(final)
    os.replace(partial, final)
    atomic_write_text(root / LATEST_FILE, f"{step}\n")
    if keep is not None:
        for _, old in complete_checkpoints(root)[:-keep]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def resolve_resume(mode: str, root: Path, *, trust: bool = False) -> Path | None:
    """The checkpoint folder a run continues from: ``trainer.resume_mode`` auto / disable / a path.
    It must verify against its signed manifest unless ``trust`` (``trainer.trust_checkpoint``):
    nothing from it is read before that."""
    if mode == "disable":
        return None
    if mode == "auto":
        found = complete_checkpoints(root)
        path = found[-1][1] if found else None
    else:
        path = Path(mode)
        if not (path / STATE_FILE).is_file():
            raise UserError(f"trainer.resume_mode: {path} is not a complete checkpoint (expected a "
                            f"{STEP_PREFIX}N folder holding {STATE_FILE}); use auto, disable or such a path")
    if path is not None:
        unverified = check_trusted(path, trust)
        if unverified is not None:
            console.print(f"note: resuming from {path} unverified ({unverified}): trainer.trust_checkpoint=true",
                          style="yellow", markup=False, soft_wrap=True)
    return path


def read_metric_rows(path: Path) -> list[dict[str, Any]]:
    """Rows of a metrics.jsonl; a torn last line (the run was killed while writing it) is dropped,
    any other bad line is a one-line error naming it (truncating would silently lose the rows
    after it)."""
    if not path.exists():
        return []
    return [row for _, row in read_jsonl(path, torn_tail=True)]


def truncate_metrics(path: Path, step: int) -> list[dict[str, Any]]:
    """Keep the rows logged up to ``step`` (a resumed run logs the later steps again); atomic."""
    if not path.exists():  # resuming into a new run folder (not created yet): nothing to keep
        return []
    rows = [row for row in read_metric_rows(path) if int(row.get("step", 0)) <= step]
    atomic_write_text(path, "".join(json.dumps(row) + "\n" for row in rows))
    return rows
