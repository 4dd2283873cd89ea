"""Preference rows of user data -> TRL's explicit-prompt preference format.

Each row needs ``prompt`` (chat messages or a string) and ``chosen`` / ``rejected`` (the final
reply: ``[{role: assistant, content}]``, one message dict, or a string). With a chat template the
strings become messages, so pairs are rendered exactly as the RL reward worker renders
prompt + response. An optional numeric margin column is carried as ``margin`` (TRL subtracts it
inside the Bradley-Terry log-sigmoid). ``alignctl_row`` remembers the source row, so scores
computed after TRL's length filter can be matched back to the input.

Rows are checked before any training: an empty prompt or reply is an error naming the row; a pair
whose chosen and rejected final replies are the same text (whitespace stripped) carries no
preference, so such pairs are dropped with a warning that counts them, and a file made only of
them is an error naming its first row.
"""

from __future__ import annotations

import math
import sys
from typing import TYPE_CHECKING, Any

from alignctl.data.schema import identical_pair, reply_text
from alignctl.errors import UserError
from alignctl.trainers.sft_data import as_messages, group_label

if TYPE_CHECKING:
    import datasets

REQUIRED = ("prompt", "chosen", "rejected")
ROW_COLUMN = "alignctl_row"


def _margin(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{where}: expected a finite number, got {value!r}")
    return float(value)


def _nonempty(value: list[dict[str, str]] | str, where: str, what: str) -> None:
    """Message lists pass ``as_messages`` even when every content is blank: refuse those too."""
    text = value if isinstance(value, str) else " ".join(m["content"] for m in value)
    if not text.strip():
        raise UserError(f"{where}: empty {what}; expected non-empty text")


def _pair(row: dict[str, Any], i: int, chat: bool, where: str) -> tuple[Any, Any, Any]:
    """(prompt, chosen, rejected) of row ``i`` in one format, each checked non-empty."""
    prompt = as_messages(row["prompt"], "user", chat, f"{where} row {i} 'prompt'")
    _nonempty(prompt, f"{where} row {i} 'prompt'", "prompt")
    replies = []
    for key in ("chosen", "rejected"):
        reply = as_messages(row[key], "assistant", chat, f"{where} row {i} {key!r}")
        if isinstance(reply, str) != isinstance(prompt, str):
            raise UserError(f"{where} row {i}: prompt and {key} must both be chat messages or both strings")
        if not reply_text(reply):
            raise UserError(f"{where} row {i} {key!r}: empty final reply; expected non-empty text")
        replies.append(reply)
    return prompt, replies[0], replies[1]


def _report_identical(identical: list[int], total: int, where: str) -> None:
    """Identical pairs teach nothing (zero gradient): all of them is an error naming the first;
    some are dropped with a warning that counts them, never silently."""
    if not identical:
        return
    if len(identical) == total:
        raise UserError(f"{where} row {identical[0]}: chosen and rejected have the same final reply in all "
                        f"{total} pairs; expected pairs with two different replies")
    print(f"warning: {where}: dropped {len(identical)} of {total} pairs whose chosen and rejected final "
          f"replies are identical (first: row {identical[0]})", file=sys.stderr)


def to_preference(ds: datasets.Dataset, *, chat: bool, margin_key: str | None, where: str) -> datasets.Dataset:
    """A Dataset with ``prompt``, ``chosen``, ``rejected``, ``alignctl_row`` and maybe ``margin``.

    ``where`` names the source (file names) in errors, with the row index appended. Pairs whose
    replies are identical are dropped with a warning (an error when every pair is)."""
    import datasets

    for column in REQUIRED:
        if column not in ds.column_names:
            raise UserError(f"{where}: missing column {column!r}; preference data needs columns "
                            f"prompt, chosen, rejected (found: {', '.join(ds.column_names) or 'none'})")
    if len(ds) == 0:
        raise UserError(f"{where}: no preference pairs; expected at least one row")
    use_margin = margin_key is not None and margin_key in ds.column_names
    columns: dict[str, list[Any]] = {name: [] for name in (*REQUIRED, ROW_COLUMN)}
    if use_margin:
        columns["margin"] = []
    identical: list[int] = []
    for i, row in enumerate(ds.select_columns([*REQUIRED, *([margin_key] if use_margin else [])])):
        prompt, chosen, rejected = _pair(row, i, chat, where)
        if identical_pair(chosen, rejected):
            identical.append(i)
            continue
        for key, value in (("prompt", prompt), ("chosen", chosen), ("rejected", rejected), (ROW_COLUMN, i)):
            columns[key].append(value)
        if use_margin:
            columns["margin"].append(_margin(row[margin_key], f"{where} row {i} {margin_key!r}"))
    _report_identical(identical, len(ds), where)
    return datasets.Dataset.from_dict(columns)


def group_labels(ds: datasets.Dataset, key: str, where: str) -> list[str]:
    """The ``data.group_key`` value of every row as text: ``column`` or ``column.key`` inside a dict
    column. A missing column, or a row without the key, is an error naming the file and row."""
    column = key.partition(".")[0]
    if column not in ds.column_names:
        raise UserError(f"{where}: data.group_key {key!r}: no column {column!r} "
                        f"(found: {', '.join(ds.column_names) or 'none'})")
    # The same 'column.key' reading as the SFT stage's prompt_key.
    return [group_label(row, key, f"{where} row {i}", "data.group_key")
            for i, row in enumerate(ds.select_columns([column]))]
