"""Reading raw input rows (jsonl, jsonl.gz, parquet, csv) with errors that name the file and line.

Also the one JSON-lines reader (:func:`read_jsonl`) and the one parquet reader
(:func:`read_parquet`, :func:`parquet_columns`) every other module uses.

Every malformed row goes through :class:`BadRows`: without ``skip_bad_rows`` the first one raises
``UserError("FILE:LINE: what was expected")``; with it, the row is skipped and counted by reason,
and the first few are kept as examples for the report. Problems with the file as a whole
(missing, empty, unreadable, unknown format) always raise.
"""

from __future__ import annotations

import csv
import gzip
import json
import os
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alignctl.errors import UserError

if TYPE_CHECKING:  # pyarrow is imported when a parquet file is read, not with this module
    import pyarrow as pa

# Per split, the file names looked for inside an input folder, in this order.
SPLIT_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet", ".csv")
FORMATS = "jsonl, jsonl.gz, parquet or csv"

_TYPE_NAMES = {str: "a string", int: "an integer", float: "a number", bool: "a boolean",
               list: "a list", dict: "an object"}


@dataclass
class Record:
    """One raw input row and where it came from (``FILE:LINE`` or ``FILE:row N``)."""

    where: str
    data: dict[str, Any]


@dataclass
class BadRows:
    """Raise on the first bad row, or (``skip=True``) count it by reason and keep a few examples."""

    skip: bool = False
    counts: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)
    max_examples: int = 5

    def bad(self, where: str, reason: str, message: str) -> None:
        text = f"{where}: {message}"
        if not self.skip:
            raise UserError(text)
        self.counts[reason] += 1
        if len(self.examples) < self.max_examples:
            self.examples.append(text)


def _describe(value: Any) -> str:
    if value is None:
        return "null"
    shown = repr(value)
    return f"{type(value).__name__} {shown[:40] + '...' if len(shown) > 40 else shown}"


def check_fields(data: dict[str, Any], required: Mapping[str, type],
                 optional: Mapping[str, type] | None = None) -> tuple[str, str] | None:
    """(reason, message) for the first missing / mistyped field, or None when the row is fine.
    Optional fields may be absent or null."""
    for name, tp in required.items():
        if name not in data:
            return f"missing_field:{name}", f"missing field {name!r} (expected {_TYPE_NAMES[tp]})"
    for name, tp in {**required, **(optional or {})}.items():
        value = data.get(name)
        if name not in required and value is None:
            continue
        if not isinstance(value, tp) or (tp is int and isinstance(value, bool)):
            return (f"wrong_type:{name}",
                    f"field {name!r} expected {_TYPE_NAMES[tp]}, got {_describe(value)}")
    return None


def _jsonl_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as fh:
            yield from enumerate(fh, start=1)
    except (OSError, EOFError) as exc:  # gzip.BadGzipFile is an OSError
        raise UserError(f"{path}: cannot read file ({exc})") from None


def read_jsonl(path: str | Path, bad: BadRows | None = None, *, allow_empty: bool = True,
               torn_tail: bool = False) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` per non-blank line of a ``.jsonl`` / ``.jsonl.gz`` file, ``where`` being
    ``FILE:LINE``: the one JSON-lines reader (input rows, tokenizer training text, metrics.jsonl).

    A line that is not UTF-8 or not JSON goes to ``bad``; without one, the first such line raises
    ``UserError("FILE:LINE: expected one JSON object per line, got invalid JSON (...)")``. What a
    value must be (an object, with which fields) is the caller's check. ``allow_empty=False``:
    a file without a single non-blank line is a UserError. ``torn_tail=True``: an unparsable
    last line with no newline at its end is dropped, not reported: a writer killed in the middle
    of a line (the metrics of a run being written or killed)."""
    path = Path(path)
    bad = bad if bad is not None else BadRows()
    seen = False
    for line_no, raw in _jsonl_lines(path):
        where = f"{path}:{line_no}"
        if not raw.strip():
            continue  # blank lines (a trailing newline, spacing) carry no row
        seen = True
        try:
            value = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            if torn_tail and not raw.endswith(b"\n"):
                return  # only the last line can lack its newline
            if isinstance(exc, UnicodeDecodeError):
                bad.bad(where, "invalid_utf8", "line is not valid UTF-8 text")
            else:
                bad.bad(where, "invalid_json", f"expected one JSON object per line, got invalid JSON ({exc.msg})")
            continue
        yield where, value
    if not seen and not allow_empty:
        raise UserError(f"{path}: empty file, expected JSON lines (one object per line)")


def _read_jsonl(path: Path, bad: BadRows) -> Iterator[Record]:
    for where, data in read_jsonl(path, bad, allow_empty=False):
        if not isinstance(data, dict):
            bad.bad(where, "not_object", f"expected a JSON object per line, got {type(data).__name__}")
            continue
        yield Record(where, data)


# ------------------------------------------------------------------------------------- parquet


def _parquet_where(path: str | os.PathLike[str], key: str | None) -> str:
    return f"{key} {os.fspath(path)}" if key else os.fspath(path)


def _open_parquet(path: str | os.PathLike[str], what: str, key: str | None) -> Any:
    """A ``pyarrow.parquet.ParquetFile`` (footer read, no data yet), or a one-line UserError."""
    import pyarrow.parquet as pq

    where = _parquet_where(path, key)
    file = Path(path).expanduser()
    if not file.exists():
        raise UserError(f"{where}: file not found; expected a parquet file of {what}")
    if file.is_dir():
        raise UserError(f"{where}: is a folder; expected a parquet file of {what} (name the file in it, "
                        f"e.g. train.parquet)")
    try:
        return pq.ParquetFile(file)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid / OSError subclasses for a bad file
        raise UserError(f"{where}: not a readable parquet file ({_first_line(exc)}); expected {what}") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def require_columns(where: str, found: Sequence[str], required: Sequence[str], what: str) -> None:
    """UserError ``WHERE: missing column 'x'; expected WHAT (found: ...)`` when a ``required``
    column is absent; ``a.b`` (a field of a dict column) needs the column ``a``."""
    missing = [c for c in required if c.split(".", 1)[0] not in found]
    if missing:
        names = ", ".join(repr(c) for c in missing)
        raise UserError(f"{where}: missing column{'s' if len(missing) > 1 else ''} {names}; expected {what} "
                        f"(found: {', '.join(found) or 'none'})")


def parquet_columns(path: str | os.PathLike[str], what: str = "rows", *, key: str | None = None) -> list[str]:
    """The column names of a parquet file, from its footer (no data read); the errors of
    :func:`read_parquet`."""
    with _open_parquet(path, what, key) as file:
        return list(file.schema_arrow.names)


def read_parquet(path: str | os.PathLike[str], what: str = "rows", *, key: str | None = None,
                 columns: Sequence[str] | None = None, required: Sequence[str] = (),
                 allow_empty: bool = True) -> pa.Table:
    """The one parquet reader: ``path`` as a ``pyarrow.Table`` (``.to_pandas()`` for a DataFrame,
    ``.to_pylist()`` for row dicts); ``columns``: read only these (each one required).

    Every problem is a one-line UserError that starts with ``[KEY ]PATH:`` (``key``: the config key
    or option that named the file) and ends with what was expected (``what``, e.g. "RL prompt
    rows"): the file is missing, a folder, not parquet or unreadable; a ``required`` column is
    missing (checked against the footer, before any data is read); with ``allow_empty=False``, it
    has no rows."""
    where = _parquet_where(path, key)
    with _open_parquet(path, what, key) as file:
        require_columns(where, file.schema_arrow.names, [*required, *(c for c in columns or () if c not in required)],
                        what)
        try:
            table = file.read(columns=list(columns) if columns is not None else None)
        except Exception as exc:  # noqa: BLE001 - a corrupt data page
            raise UserError(f"{where}: not a readable parquet file ({_first_line(exc)}); expected {what}") from None
    if not allow_empty and table.num_rows == 0:
        raise UserError(f"{where}: no rows; expected {what}")
    return table


def _read_parquet(path: Path) -> Iterator[Record]:
    rows = read_parquet(path, "input rows", allow_empty=False).to_pylist()
    for i, row in enumerate(rows, start=1):
        yield Record(f"{path}:row {i}", row)


def _read_csv(path: Path) -> Iterator[Record]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            reader = csv.DictReader(fh)
            if not reader.fieldnames:
                raise UserError(f"{path}: empty file, expected a CSV header line and rows")
            seen = False
            for row in reader:
                seen = True
                # line_num is the physical line where this record ended (quoted fields may span lines).
                yield Record(f"{path}:{reader.line_num}", {k: v for k, v in row.items() if k is not None})
            if not seen:
                raise UserError(f"{path}: empty file, expected CSV rows after the header line")
    except UnicodeDecodeError:
        raise UserError(f"{path}: cannot read file (not UTF-8 text)") from None


def read_records(path: str | Path, bad: BadRows, required: Mapping[str, type] | None = None,
                 optional: Mapping[str, type] | None = None) -> Iterator[Record]:
    """Rows of a jsonl / jsonl.gz / parquet / csv file whose ``required`` fields are present with
    the given types (``optional`` ones typed when present); other rows go to ``bad``."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: input file not found")
    if path.is_dir():
        raise UserError(f"{path}: expected a file ({FORMATS}), got a folder")
    name = path.name.lower()
    if name.endswith((".jsonl", ".jsonl.gz")):
        records = _read_jsonl(path, bad)
    elif name.endswith(".parquet"):
        records = _read_parquet(path)
    elif name.endswith(".csv"):
        records = _read_csv(path)
    else:
        raise UserError(f"{path}: unknown input format, expected {FORMATS}")
    for record in records:
        problem = check_fields(record.data, required or {}, optional)
        if problem is not None:
            bad.bad(record.where, *problem)
            continue
        yield record


def split_files(path: str | Path, splits: tuple[str, ...] = ("train", "test")) -> dict[str, Path]:
    """Input files by split name: a file is the single split ``train``; a folder holds
    ``<split>.jsonl`` (or .jsonl.gz / .parquet / .csv) per split, at least one of them."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: input not found (expected a file or a folder)")
    if path.is_file():
        return {"train": path}
    found: dict[str, Path] = {}
    for split in splits:
        candidates = [path / f"{split}{suffix}" for suffix in SPLIT_SUFFIXES
                      if (path / f"{split}{suffix}").is_file()]
        if len(candidates) > 1:
            names = ", ".join(c.name for c in candidates)
            raise UserError(f"{path}: ambiguous input for split {split!r} ({names}); keep only one")
        if candidates:
            found[split] = candidates[0]
    if not found:
        expected = ", ".join(f"{s}.jsonl" for s in splits)
        raise UserError(f"{path}: no input files found, expected {expected} (or .jsonl.gz/.parquet/.csv)")
    return found
