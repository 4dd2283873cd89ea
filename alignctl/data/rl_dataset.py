"""RL prompts: preprocess parquet -> chat-templated token ids, and a seeded, resumable loader.

The controller tokenizes (it needs the tokenizer, never the weights); workers get token ids.
Prompts longer than ``max_prompt_length`` are filtered out and counted, never truncated silently.
``data.custom_cls.path/name`` swaps in a user class with the same interface
(``__len__``, ``__getitem__ -> dict`` with at least ``prompt_ids``, and ``filtered``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from alignctl.batch import Batch
from alignctl.data.readers import read_parquet
from alignctl.errors import UserError
from alignctl.tools.chat import render_prompt
from alignctl.user_code import import_file

# reward_model (the rule ground truth) is optional: reward-model-only runs (e.g. HH) have none.
REQUIRED_COLUMNS = ("data_source",)


def plain_python(value: Any) -> Any:
    """Parquet gives numpy arrays (and scalars) for lists; reward functions and chat templates
    want plain Python objects."""
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, dict):
        return {k: plain_python(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain_python(v) for v in value]
    return value


def read_prompt_files(files: list[str], prompt_key: str) -> pd.DataFrame:
    frames = [read_parquet(name, "RL prompt rows from 'alignctl preprocess'",
                           required=(prompt_key, *REQUIRED_COLUMNS)).to_pandas() for name in files]
    frame = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    if frame.empty:
        raise UserError(f"{', '.join(files)}: no prompt rows")
    return frame


class RLPromptDataset:
    """Tokenized prompts with everything a reward function needs kept raw."""

    def __init__(self, files: list[str], tokenizer: Any, *, prompt_key: str = "prompt",
                 max_prompt_length: int = 512, max_samples: int | None = None,
                 tools: list[dict[str, Any]] | None = None) -> None:
        """``tools``: OpenAI function schemas presented in every prompt (multi-turn rollouts)."""
        frame = read_prompt_files(files, prompt_key)
        if max_samples is not None:
            frame = frame.iloc[:max_samples]
        self.rows: list[dict[str, Any]] = []
        self.filtered = 0
        for record in frame.to_dict(orient="records"):
            messages = plain_python(record[prompt_key])
            ids = render_prompt(tokenizer, messages, tools or [])
            if len(ids) > max_prompt_length:
                self.filtered += 1
                continue
            reward_model = plain_python(record.get("reward_model")) or {}
            self.rows.append({
                "prompt_ids": ids,
                "raw_prompt": messages,
                "data_source": str(record["data_source"]),
                "ground_truth": reward_model.get("ground_truth"),
                "extra_info": plain_python(record.get("extra_info")) or {},
            })
        if not self.rows:
            raise UserError(f"{', '.join(files)}: every prompt is longer than data.max_prompt_length="
                            f"{max_prompt_length} tokens ({self.filtered} filtered)")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return self.rows[index]


def load_dataset_class(path: str, name: str) -> type:
    if not Path(path).exists():
        raise UserError(f"{path}: data.custom_cls.path not found")
    module = import_file(f"alignctl_user_dataset_{Path(path).stem}", path)
    if module is None:
        raise UserError(f"{path}: data.custom_cls.path not found")
    if not hasattr(module, name):
        raise UserError(f"{path}: no class {name!r} (data.custom_cls.name)")
    return getattr(module, name)


def to_batch(rows: list[dict[str, Any]], uids: list[int]) -> Batch:
    """Prompt rows -> a Batch of lists (one row per prompt)."""
    lists = {key: [row[key] for row in rows] for key in rows[0]}
    lists["uid"] = list(uids)
    return Batch({}, lists)


@dataclass
class PromptLoader:
    """Seeded epoch-wise shuffling in fixed batches (last partial batch dropped, like verl).

    ``state_dict`` is (epoch, position) so a resumed run draws exactly the prompts it would have."""

    dataset: Any
    batch_size: int
    shuffle: bool = True
    seed: int = 1
    epoch: int = 0
    position: int = 0
    _order: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        if len(self.dataset) < self.batch_size:
            raise UserError(f"data.train_batch_size={self.batch_size} is larger than the dataset "
                            f"({len(self.dataset)} prompts)")
        self._order = self._epoch_order(self.epoch)

    @property
    def steps_per_epoch(self) -> int:
        return len(self.dataset) // self.batch_size

    def _epoch_order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(len(self.dataset)))
        gen = torch.Generator().manual_seed(self.seed * 100003 + epoch)
        return torch.randperm(len(self.dataset), generator=gen).tolist()

    def next_batch(self) -> Batch:
        if self.position >= self.steps_per_epoch:
            self.epoch += 1
            self.position = 0
            self._order = self._epoch_order(self.epoch)
        start = self.position * self.batch_size
        indices = self._order[start:start + self.batch_size]
        self.position += 1
        uids = [self.epoch * len(self.dataset) + i for i in indices]
        return to_batch([self.dataset[i] for i in indices], uids)

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self._order = self._epoch_order(self.epoch)
