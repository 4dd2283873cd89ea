"""Pipeline files: named stages, each a stage kind + its config, chained by references.

    workdir: work/quickstart           # artifacts go to <workdir>/<stage>-<key12>/
    stages:
      data:  {kind: preprocess, config: {dataset: arith}}
      base:  {kind: init-model, config: {tokenizer_from: ["${data}/sft_train.parquet"]}}
      sft:   {kind: sft, config: {model: {path: "${base}"}, data: {train_files: ["${data}/sft_train.parquet"]}}}

``${name}`` (optionally followed by ``/sub/path``) in any string value is the artifact folder of
stage ``name``; it makes ``name`` an upstream of the stage. Stages run in dependency order.

Relative paths in the file (``workdir`` and the stages' input files) start from the folder holding
the file, or from ``root:`` when the file sets it (itself relative to the file's folder), never from
the current folder: ``alignctl status`` and ``alignctl run`` find the same artifacts wherever they are
typed. Paths given on the command line (``workdir=...``, ``stage.key=...``) start from the current
folder, as any command-line path does.

A stage may also say ``cpu_share: 0.5`` (a number in (0, 1], default 1): it then runs in a process of
its own on that share of the machine's cores, beside other stages whose inputs are ready and whose
shares fit (``pipeline/concurrent.py``).
"""

from __future__ import annotations

import copy
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignctl.config.core import apply_overrides, read_yaml_mapping
from alignctl.errors import UserError

REFERENCE = re.compile(r"\$\{([A-Za-z0-9_\-]+)\}")
STAGE_NAME = re.compile(r"^[A-Za-z0-9_\-]+$")


@dataclass
class StageSpec:
    name: str
    kind: str
    config: dict[str, Any]
    upstream: list[str] = field(default_factory=list)
    cpu_share: float = 1.0  # of the cores alignctl may use; below 1 the stage may run beside others


@dataclass
class PipelineSpec:
    path: Path
    workdir: Path  # absolute
    stages: dict[str, StageSpec]  # in run (topological) order
    overrides: list[str] = field(default_factory=list)  # as given on the command line (a stage process reloads them)
    root: Path = Path(".")  # absolute: where the file's relative paths start


def references(value: Any) -> set[str]:
    """Stage names referenced anywhere inside a (nested) config value."""
    if isinstance(value, str):
        return set(REFERENCE.findall(value))
    if isinstance(value, dict):
        return set().union(*(references(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(references(v) for v in value)) if value else set()
    return set()


def substitute(value: Any, mapping: dict[str, str]) -> Any:
    """Replace every ``${name}`` by ``mapping[name]`` inside a (nested) config value."""
    if isinstance(value, str):
        return REFERENCE.sub(lambda m: mapping[m.group(1)], value)
    if isinstance(value, dict):
        return {k: substitute(v, mapping) for k, v in value.items()}
    if isinstance(value, list):
        return [substitute(v, mapping) for v in value]
    return value


def _looks_like_path(text: str) -> bool:
    """A relative path written in the file: it has a folder separator or a file suffix (bare words
    such as ``arith`` or ``grpo`` are names, never paths) and no reference or URL."""
    if not text or "${" in text or "://" in text or "\n" in text or Path(text).is_absolute() or text.startswith("~"):
        return False
    return "/" in text or bool(Path(text).suffix)


def resolve_paths(value: Any, root: Path) -> Any:
    """Relative paths inside a (nested) stage config made absolute against ``root``: ``./x`` and
    ``../x`` always, other relative paths when they exist there (``org/model`` that is not a folder
    under ``root`` stays a hub name)."""
    if isinstance(value, dict):
        return {k: resolve_paths(v, root) for k, v in value.items()}
    if isinstance(value, list):
        return [resolve_paths(v, root) for v in value]
    if isinstance(value, str) and _looks_like_path(value):
        candidate = root / value
        if value.startswith(("./", "../")) or candidate.exists():
            return str(Path(os.path.normpath(candidate)))
    return value


def _root(path: Path, data: dict[str, Any]) -> Path:
    folder = path.absolute().parent
    raw = data.get("root", ".")
    if not isinstance(raw, str) or not raw.strip():
        raise UserError(f"{path}: 'root' expected a folder path (relative to the file's folder), got {raw!r}")
    root = Path(os.path.normpath(folder / Path(raw).expanduser()))
    if not root.is_dir():
        raise UserError(f"{path}: 'root' {raw!r} is {root}, which is not a folder")
    return root


def _stage(path: Path, name: str, raw: Any, kinds: set[str]) -> StageSpec:
    where = f"{path}: stage {name!r}"
    if not STAGE_NAME.match(str(name)):
        raise UserError(f"{where}: stage names may hold letters, digits, '_' and '-' only")
    if not isinstance(raw, dict):
        raise UserError(f"{where}: expected a mapping with 'kind' and 'config'")
    unknown = set(raw) - {"kind", "config", "cpu_share"}
    if unknown:
        raise UserError(f"{where}: unknown key(s) {sorted(unknown)}; expected 'kind', 'config' and optionally 'cpu_share'")
    kind = raw.get("kind")
    if kind not in kinds:
        raise UserError(f"{where}: 'kind' expected one of {', '.join(sorted(kinds))}, got {kind!r}")
    config = raw.get("config") or {}
    if not isinstance(config, dict):
        raise UserError(f"{where}: 'config' expected a mapping of config keys")
    return StageSpec(str(name), kind, copy.deepcopy(config), cpu_share=_cpu_share(where, raw.get("cpu_share", 1.0)))


def _cpu_share(where: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < float(value) <= 1.0:
        raise UserError(f"{where}: 'cpu_share' expected a number in (0, 1] (the share of the machine's cores the "
                        f"stage runs on), got {value!r}")
    return float(value)


def _number(text: str) -> Any:
    try:
        return float(text)
    except ValueError:
        return text


def _order(path: Path, stages: dict[str, StageSpec]) -> dict[str, StageSpec]:
    """Topological order (file order among independent stages); cycles and dangling refs fail."""
    for stage in stages.values():
        stage.upstream = sorted(references(stage.config))
        missing = [u for u in stage.upstream if u not in stages]
        if missing:
            raise UserError(f"{path}: stage {stage.name!r} references unknown stage(s) {missing}; "
                            f"known: {', '.join(stages)}")
    ordered: dict[str, StageSpec] = {}
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in ordered:
            return
        if name in visiting:
            raise UserError(f"{path}: stages reference each other in a cycle through {name!r}")
        visiting.add(name)
        for up in stages[name].upstream:
            visit(up)
        visiting.discard(name)
        ordered[name] = stages[name]

    for name in stages:
        visit(name)
    return ordered


def load_pipeline(path: str | Path, overrides: list[str], kinds: set[str]) -> PipelineSpec:
    """Read a pipeline file; ``overrides`` are ``stage.key.sub=value`` (and ``workdir=...``)."""
    path = Path(path)
    data = read_yaml_mapping(path)
    unknown = set(data) - {"workdir", "stages", "description", "root"}
    if unknown:
        raise UserError(f"{path}: unknown top-level key(s) {sorted(unknown)}; expected workdir, stages, description, "
                        f"root")
    raw_stages = data.get("stages")
    if not isinstance(raw_stages, dict) or not raw_stages:
        raise UserError(f"{path}: 'stages' expected a non-empty mapping of stage name -> {{kind, config}}")
    root = _root(path, data)
    stages = {name: _stage(path, name, raw, kinds) for name, raw in raw_stages.items()}
    for stage in stages.values():
        stage.config = resolve_paths(stage.config, root)
    workdir, base = data.get("workdir", "work"), root
    for text in overrides:
        head, _, rest = text.partition(".")
        if text.startswith("workdir="):
            workdir, base = text.partition("=")[2], Path.cwd()
        elif head in stages and rest.startswith("cpu_share="):
            stages[head].cpu_share = _cpu_share(f"command-line override {text!r}", _number(rest.partition("=")[2]))
        elif head in stages and rest:
            apply_overrides(stages[head].config, [rest])
        else:
            raise UserError(f"command-line override {text!r}: expected STAGE.key=value with STAGE one of "
                            f"{', '.join(stages)} (or workdir=PATH)")
    if not isinstance(workdir, str) or not workdir.strip():
        raise UserError(f"{path}: 'workdir' expected a folder path, got {workdir!r}")
    folder = Path(os.path.normpath(base / Path(workdir).expanduser()))
    return PipelineSpec(path, folder, _order(path, stages), list(overrides), root)
