"""The data protocol between the controller and the workers.

A :class:`Batch` is a set of named columns over the same rows (one row per response): tensors
whose first dimension is the row, plain Python lists for everything else (raw prompts, ground
truths, data sources), and ``meta`` for batch-level values (temperature, global token counts).
Workers receive and return Batches; the controller ``union``\\ s the results into one batch per
step (``RLTrainer.train_step``). It pickles cheaply, so Ray moves it between processes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch


def pad_rows(rows: Sequence[Sequence[int | float]], value: int | float, *, width: int | None = None,
             side: Literal["right", "left"] = "right",
             dtype: torch.dtype = torch.long) -> tuple[torch.Tensor, torch.Tensor]:
    """Ragged rows (token ids, log-probs, 0/1 flags) -> a ``[N, width]`` tensor and its mask.

    Each row's entries go to the right end (``side="left"``: left-padded prompts) or the left end
    (``side="right"``: responses, RM inputs) of its row; every other cell holds ``value``. The mask
    is a long tensor, 1 where a row's entry is. ``width`` defaults to the longest row (0 without
    rows); a row longer than ``width`` is a ValueError. The one padding routine for rollout
    outputs, batch assembly, prompt prefill and reward-model scoring."""
    if side not in ("right", "left"):
        raise ValueError(f"pad side {side!r}; expected 'right' or 'left'")
    rows = [row.tolist() if isinstance(row, torch.Tensor) else list(row) for row in rows]
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    longest = int(lengths.max()) if rows else 0
    if width is None:
        width = longest
    elif longest > width:
        i = int(torch.argmax(lengths))
        raise ValueError(f"row {i} has {longest} entries, more than the width {width}")
    columns = torch.arange(width)
    if side == "right":
        mask = columns[None, :] < lengths[:, None]
    else:
        mask = columns[None, :] >= (width - lengths)[:, None]
    out = torch.full((len(rows), width), value, dtype=dtype)
    # Boolean indexing walks the mask row by row, left to right: exactly the rows' entries in order.
    out[mask] = torch.tensor([x for row in rows for x in row], dtype=dtype)
    return out, mask.long()


@dataclass
class Batch:
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    lists: dict[str, list[Any]] = field(default_factory=dict)
    meta: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        sizes = {k: v.shape[0] for k, v in self.tensors.items()}
        sizes.update({k: len(v) for k, v in self.lists.items()})
        if len(set(sizes.values())) > 1:
            raise ValueError(f"Batch columns disagree on the number of rows: {sizes}")

    def __len__(self) -> int:
        for value in self.tensors.values():
            return int(value.shape[0])
        for items in self.lists.values():
            return len(items)
        return 0

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self.lists:
            return self.lists[key]
        raise KeyError(f"Batch has no column {key!r}; it has {sorted(self.keys())}")

    def __contains__(self, key: str) -> bool:
        return key in self.tensors or key in self.lists

    def keys(self) -> list[str]:
        return [*self.tensors, *self.lists]

    # ------------------------------------------------------------------ combining

    def union(self, other: Batch) -> Batch:
        """Columns of both (same rows); a column present in both must be equal."""
        if len(self) and len(other) and len(self) != len(other):
            raise ValueError(f"cannot union batches of {len(self)} and {len(other)} rows")
        tensors = dict(self.tensors)
        for key, value in other.tensors.items():
            if key in tensors and not torch.equal(tensors[key], value):
                raise ValueError(f"union: column {key!r} differs between the batches")
            tensors[key] = value
        lists = {**self.lists, **other.lists}
        return Batch(tensors, lists, {**self.meta, **other.meta})

    @staticmethod
    def concat(parts: Sequence[Batch]) -> Batch:
        """Rows of all parts in order; meta is taken from the first part."""
        parts = [p for p in parts if len(p) or p.keys()]
        if not parts:
            return Batch()
        tensors = {k: torch.cat([p.tensors[k] for p in parts]) for k in parts[0].tensors}
        lists = {k: [x for p in parts for x in p.lists[k]] for k in parts[0].lists}
        return Batch(tensors, lists, dict(parts[0].meta))

    # ------------------------------------------------------------------ slicing

    def select(self, keys: Iterable[str], meta: bool = True) -> Batch:
        keys = list(keys)
        return Batch({k: self.tensors[k] for k in keys if k in self.tensors},
                     {k: self.lists[k] for k in keys if k in self.lists},
                     dict(self.meta) if meta else {})

    def index(self, rows: Sequence[int] | torch.Tensor) -> Batch:
        idx = torch.as_tensor(rows, dtype=torch.long)
        order = idx.tolist()
        return Batch({k: v[idx] for k, v in self.tensors.items()},
                     {k: [v[i] for i in order] for k, v in self.lists.items()}, dict(self.meta))

    def slice(self, start: int, stop: int) -> Batch:
        return Batch({k: v[start:stop] for k, v in self.tensors.items()},
                     {k: v[start:stop] for k, v in self.lists.items()}, dict(self.meta))

    def chunk(self, parts: int) -> list[Batch]:
        """``parts`` equal consecutive pieces; the row count must divide evenly (so every worker
        does the same amount of work and collectives line up)."""
        if len(self) % parts:
            raise ValueError(f"cannot split {len(self)} rows into {parts} equal parts")
        size = len(self) // parts
        return [self.slice(i * size, (i + 1) * size) for i in range(parts)]

    def split(self, size: int) -> list[Batch]:
        """Consecutive pieces of ``size`` rows (the last may be shorter)."""
        return [self.slice(i, min(i + size, len(self))) for i in range(0, len(self), size)]

    def repeat_interleave(self, n: int) -> Batch:
        """Each row ``n`` times in a row: prompts -> one row per response."""
        idx = torch.arange(len(self)).repeat_interleave(n)
        return self.index(idx)

    def to(self, device: torch.device | str) -> Batch:
        return Batch({k: v.to(device) for k, v in self.tensors.items()}, self.lists, self.meta)
