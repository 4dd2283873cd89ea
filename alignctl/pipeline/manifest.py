"""``manifest.json``: the last file written into an artifact folder, so its presence means complete.

It records what produced the artifact (stage kind, resolved config, input artifact keys), what is
in it (output files), headline metrics, wall time and the versions of the packages involved.
"""

from __future__ import annotations

import importlib.metadata
import json
import math
import platform
import time
from pathlib import Path
from typing import Any

MANIFEST = "manifest.json"
_PACKAGES = ("alignctl", "torch", "transformers", "trl", "datasets", "ray", "deepspeed", "peft",
             "math-verify", "vllm")


def package_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for name in _PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            continue
    return versions


def jsonable(value: Any) -> Any:
    """Floats that JSON cannot hold (nan/inf) become strings instead of invalid JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return jsonable(value.item())
    return value


def write_manifest(folder: str | Path, *, stage: str, config: dict[str, Any],
                   inputs: dict[str, str] | None = None, metrics: dict[str, Any] | None = None,
                   wall_time_s: float | None = None, key: str | None = None,
                   extra: dict[str, Any] | None = None) -> Path:
    """Write ``manifest.json`` into ``folder`` (call it last, inside the atomic temp folder)."""
    folder = Path(folder)
    outputs = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                     and p.name != MANIFEST)
    manifest = {
        "stage": stage,
        "key": key,
        "config": config,
        "inputs": inputs or {},
        "outputs": outputs,
        "metrics": metrics or {},
        "wall_time_s": wall_time_s,
        "created_unix": time.time(),
        "versions": package_versions(),
        **(extra or {}),
    }
    path = folder / MANIFEST
    path.write_text(json.dumps(jsonable(manifest), indent=2, sort_keys=False) + "\n", encoding="utf-8")
    return path


def read_manifest(folder: str | Path) -> dict[str, Any] | None:
    """The manifest of a complete artifact, or None when absent/unreadable (= incomplete)."""
    path = Path(folder) / MANIFEST
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None


def starting_model(folder: str | Path) -> str | None:
    """The model an artifact was trained from, as its manifest records it: an RL policy's initial
    actor (``base_model``), an SFT model's ``model.path``; None when nothing is recorded."""
    manifest = read_manifest(folder)
    if not manifest:
        return None
    if manifest.get("base_model"):
        return str(manifest["base_model"])
    model = (manifest.get("config") or {}).get("model")
    if manifest.get("stage") == "sft" and isinstance(model, dict) and model.get("path"):
        return str(model["path"])
    return None
