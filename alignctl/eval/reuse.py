"""Responses an earlier evaluation already generated, taken instead of generating them again.

Two evaluations of different policies against the same reference (the quickstart's GRPO and PPO
evals) would otherwise decode the reference's answers twice. Every eval stores what each model
generated in ``generations.json`` with a fingerprint of everything that decides those texts:
the model's weights files (path, size, modification time), the tokenized prompts, the sampling
settings, the batch size, the seed and role (they seed each batch), dtype and device. A later eval
that names that output in ``reuse_generations`` takes a model's responses from it only when the
fingerprint is the same (and says so in a note); otherwise it generates them as usual.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from alignctl.eval.generate import Generations

FILE = "generations.json"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf")


def model_identity(path: str) -> dict[str, Any]:
    """The folder's absolute path and each weights file's name, size and mtime: a retrained model
    written to the same folder gets a different identity."""
    folder = Path(path).expanduser().absolute()
    files = sorted(p for p in folder.iterdir() if p.suffix in WEIGHT_SUFFIXES) if folder.is_dir() else []
    stats = [(p.name, p.stat()) for p in files]
    return {"path": str(folder), "weights": [[name, st.st_size, st.st_mtime_ns] for name, st in stats]}


def fingerprint(model_path: str, prompt_ids: list[list[int]], settings: dict[str, Any]) -> str:
    """sha256 of what decides a model's responses (see the module docstring)."""
    payload = {"model": model_identity(model_path), "prompt_ids": prompt_ids, "settings": settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


def to_json(generations: dict[str, Generations], fingerprints: dict[str, str]) -> dict[str, Any]:
    return {role: {"fingerprint": fingerprints[role], "texts": g.texts, "token_lengths": g.token_lengths,
                   "truncated": g.truncated} for role, g in generations.items()}


def read_all(sources: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Each source folder with its ``generations.json``, read once for every model of the eval."""
    return [(source, read(source)) for source in sources]


def find(stored: list[tuple[str, dict[str, Any]]], wanted: str) -> tuple[Generations, str] | None:
    """Generations with fingerprint ``wanted`` from the first source (of :func:`read_all`) that has them."""
    for source, entries in stored:
        for entry in entries.values():
            if entry.get("fingerprint") == wanted:
                return Generations(entry["texts"], entry["token_lengths"], entry["truncated"]), source
    return None


def read(source: str) -> dict[str, Any]:
    """``generations.json`` of an eval output folder ({} when it has none or it is unreadable:
    the responses are then generated, as without reuse)."""
    path = Path(os.fspath(source)).expanduser() / FILE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}
