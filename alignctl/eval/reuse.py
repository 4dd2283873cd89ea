"""Responses an earlier evaluation already generated, taken instead of generating them again.

Two evaluations of different policies against the same reference (the quickstart's GRPO and PPO
evals) would otherwise decode the reference's answers twice. Every eval stores what each model
generated in ``generations.json`` with a fingerprint of everything that decides those texts:
the model's weights files (path, size, modification time), the tokenized prompts, the sampling
settings, the batch size, the seed and role (they seed each batch), dtype and device. A later eval
that names that output in ``reuse_generations`` takes a model's responses from it only when the
fingerprint is the same (and says so in a note); otherwise it generates them as usual.

Scores travel with the responses. Each entry also keeps what every reward model of that eval scored
them, under a key of what decides a score besides the responses: the reward model's weights files,
dtype, device, precision, truncation length and normalisation (:func:`scorer_key`). A later eval
that takes those responses and scores them with the same reward model takes the scores as well (the
quickstart's judge scores the SFT model's answers once, not in both evals). A taken score equals a
fresh one up to the rounding of batching (the same sequences, packed beside other ones); under bf16
autocast that is enough to turn a verdict on a near tie.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

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


def scorer_key(model_path: str, settings: dict[str, Any]) -> str:
    """sha256 of what decides a reward model's score of given responses (module docstring)."""
    payload = {"model": model_identity(model_path), "settings": settings}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode("utf-8")).hexdigest()


@dataclass
class ScoreBook:
    """Each role's scores [P][n] by scorer key: those stored with reused responses (``stored``) and
    those this eval computed (``computed``); both go into this eval's ``generations.json``."""

    stored: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)
    computed: dict[str, dict[str, list[list[float]]]] = field(default_factory=dict)

    def known(self, key: str, roles: list[str]) -> dict[str, np.ndarray]:
        """role -> stored scores of ``roles`` under ``key`` (roles without them are left out)."""
        return {role: np.asarray(self.stored[role][key], dtype=np.float64) for role in roles
                if key in self.stored.get(role, {})}

    def record(self, key: str, scores: dict[str, np.ndarray]) -> None:
        for role, values in scores.items():
            self.computed.setdefault(role, {})[key] = np.asarray(values, dtype=np.float64).tolist()

    def for_role(self, role: str) -> dict[str, list[list[float]]]:
        return {**self.stored.get(role, {}), **self.computed.get(role, {})}


def to_json(generations: dict[str, Generations], fingerprints: dict[str, str], book: ScoreBook) -> dict[str, Any]:
    return {role: {"fingerprint": fingerprints[role], "texts": g.texts, "token_lengths": g.token_lengths,
                   "truncated": g.truncated, "scores": book.for_role(role)} for role, g in generations.items()}


def read_all(sources: list[str]) -> list[tuple[str, dict[str, Any]]]:
    """Each source folder with its ``generations.json``, read once for every model of the eval."""
    return [(source, read(source)) for source in sources]


def find(stored: list[tuple[str, dict[str, Any]]], wanted: str
         ) -> tuple[Generations, str, dict[str, list[list[float]]]] | None:
    """Generations with fingerprint ``wanted`` from the first source (of :func:`read_all`) that has
    them, the source, and the scores stored with them (scorer key -> [P][n]; {} in older files)."""
    for source, entries in stored:
        for entry in entries.values():
            if entry.get("fingerprint") == wanted:
                scores = entry.get("scores")
                return (Generations(entry["texts"], entry["token_lengths"], entry["truncated"]), source,
                        scores if isinstance(scores, dict) else {})
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
