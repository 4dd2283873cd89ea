"""Eval inputs: prompt rows (from an RL prompt parquet or Python values) and preference pairs."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from alignctl.data.readers import read_parquet
from alignctl.data.rl_dataset import plain_python, read_prompt_files
from alignctl.errors import UserError

Messages = list[dict[str, str]]


@dataclass
class PromptRow:
    """One prompt to answer. ``ground_truth`` is None when the row carries none (no accuracy)."""

    index: int
    messages: Messages
    data_source: str = "prompts"
    ground_truth: str | None = None
    extra_info: dict[str, Any] = field(default_factory=dict)

    @property
    def text(self) -> str:
        """The prompt as a person reads it (message contents; roles shown when there are several)."""
        if len(self.messages) == 1:
            return self.messages[0]["content"]
        return "\n\n".join(f"[{m['role']}] {m['content']}" for m in self.messages)


@dataclass
class PreferencePair:
    prompt: Messages
    chosen: Messages
    rejected: Messages


def _messages(value: Any, role: str, where: str) -> Messages:
    from alignctl.trainers.sft_data import as_messages

    out = as_messages(value, role, True, where)
    assert not isinstance(out, str)  # chat=True always returns messages
    return out


def load_prompt_rows(path: str | os.PathLike[str], prompt_key: str = "prompt",
                     max_prompts: int | None = None) -> list[PromptRow]:
    """RL prompt rows of ``path`` (the verl parquet schema written by ``alignctl preprocess``)."""

    frame = read_prompt_files([os.fspath(path)], prompt_key)
    if max_prompts is not None:
        frame = frame.iloc[:max_prompts]
    rows = []
    for i, record in enumerate(frame.to_dict(orient="records")):
        where = f"{path} row {i} {prompt_key!r}"
        reward_model = plain_python(record.get("reward_model")) or {}
        truth = reward_model.get("ground_truth") if isinstance(reward_model, dict) else None
        rows.append(PromptRow(
            index=i,
            messages=_messages(plain_python(record[prompt_key]), "user", where),
            data_source=str(record["data_source"]),
            ground_truth=None if truth is None or str(truth) == "" else str(truth),
            extra_info=plain_python(record.get("extra_info")) or {},
        ))
    return rows


def rows_from_python(prompts: Any, prompt_key: str = "prompt", max_prompts: int | None = None) -> list[PromptRow]:
    """Prompts for the Python API: a parquet path, a DataFrame of RL rows, or a list of strings /
    message lists (these have no ground truth, so no accuracy)."""
    if isinstance(prompts, (str, os.PathLike)):
        return load_prompt_rows(prompts, prompt_key, max_prompts)
    if hasattr(prompts, "to_dict") and hasattr(prompts, "columns"):  # a pandas DataFrame
        import tempfile

        with tempfile.TemporaryDirectory(prefix="alignctl-eval-") as tmp:
            path = Path(tmp) / "prompts.parquet"
            prompts.to_parquet(path)
            return load_prompt_rows(path, prompt_key, max_prompts)
    if not isinstance(prompts, Sequence) or not prompts:
        raise UserError("evaluate: 'prompts' expected a parquet path, a DataFrame or a non-empty list of "
                        f"strings / message lists, got {type(prompts).__name__}")
    items = list(prompts)[:max_prompts] if max_prompts is not None else list(prompts)
    return [PromptRow(index=i, messages=_messages(p, "user", f"evaluate: prompts[{i}]")) for i, p in enumerate(items)]


def load_preference_pairs(path: str | os.PathLike[str], max_pairs: int | None = None) -> list[PreferencePair]:
    """Preference rows (``prompt`` / ``chosen`` / ``rejected``; messages or strings)."""
    path = Path(path)
    frame = read_parquet(path, "preference pairs (prompt, chosen, rejected)", key="preference_data",
                         required=("prompt", "chosen", "rejected")).to_pandas()
    if max_pairs is not None:
        frame = frame.iloc[:max_pairs]
    if frame.empty:
        raise UserError(f"{path}: no preference pairs")
    pairs = []
    for i, record in enumerate(frame.to_dict(orient="records")):
        pairs.append(PreferencePair(
            prompt=_messages(plain_python(record["prompt"]), "user", f"{path} row {i} 'prompt'"),
            chosen=_messages(plain_python(record["chosen"]), "assistant", f"{path} row {i} 'chosen'"),
            rejected=_messages(plain_python(record["rejected"]), "assistant", f"{path} row {i} 'rejected'"),
        ))
    return pairs
