"""Preference rows of user data -> TRL's explicit-prompt preference format.

Each row needs ``prompt`` (chat messages or a string) and ``chosen`` / ``rejected`` (the final
reply: ``[{role: assistant, content}]``, one message dict, or a string). With a chat template the
strings become messages, so pairs are rendered exactly as the RL reward worker renders
prompt + response. An optional numeric margin column is carried as ``margin`` (TRL subtracts it
inside the Bradley-Terry log-sigmoid). ``alignctl_row`` remembers the source row, so scores
computed after TRL's length filter can be matched back to the input.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from alignctl.errors import UserError
from alignctl.trainers.sft_data import as_messages

if TYPE_CHECKING:
    import datasets

REQUIRED = ("prompt", "chosen", "rejected")
ROW_COLUMN = "alignctl_row"


def _margin(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def to_preference(ds: datasets.Dataset, *, chat: bool, margin_key: str | None, where: str) -> datasets.Dataset:
    """A Dataset with ``prompt``, ``chosen``, ``rejected``, ``alignctl_row`` and maybe ``margin``.

    ``where`` names the source (file names) in errors, with the row index appended."""
    import datasets

    for column in REQUIRED:
        if column not in ds.column_names:
            raise UserError(f"{where}: missing column {column!r}; preference data needs columns "
                            f"prompt, chosen, rejected (found: {', '.join(ds.column_names) or 'none'})")
    use_margin = margin_key is not None and margin_key in ds.column_names
    columns: dict[str, list[Any]] = {name: [] for name in (*REQUIRED, ROW_COLUMN)}
    if use_margin:
        columns["margin"] = []
    for i, row in enumerate(ds.select_columns([*REQUIRED, *([margin_key] if use_margin else [])])):
        prompt = as_messages(row["prompt"], "user", chat, f"{where} row {i} 'prompt'")
        for key in ("chosen", "rejected"):
            reply = as_messages(row[key], "assistant", chat, f"{where} row {i} {key!r}")
            if isinstance(reply, str) != isinstance(prompt, str):
                raise UserError(f"{where} row {i}: prompt and {key} must both be chat messages or both strings")
            columns[key].append(reply)
        columns["prompt"].append(prompt)
        columns[ROW_COLUMN].append(i)
        if use_margin:
            columns["margin"].append(_margin(row[margin_key], f"{where} row {i} {margin_key!r}"))
    return datasets.Dataset.from_dict(columns)
