"""Any jsonl / parquet / csv source mapped row by row by a user function.

``map_fn = "path/to/file.py:function"``; the function takes one raw row (a dict) and returns a
schema row of kind ``cfg.kind`` (``rl``, ``preference`` or ``sft``), or None to drop the row
(counted as ``map_fn_returned_none``). ``extra_info.split`` and ``extra_info.index`` are filled
in by alignctl. Every returned row is validated; a violation names the input file and row.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from alignctl.data.preprocess.common import Context
from alignctl.data.readers import Record, read_records, split_files
from alignctl.errors import UserError
from alignctl.user_code import import_file

MapFn = Callable[[dict[str, Any]], Any]


def load_map_fn(spec: str) -> MapFn:
    """Import ``function`` from ``path/to/file.py:function``; any problem is a UserError."""
    file, sep, name = spec.rpartition(":")
    if not sep or not file or not name:
        raise UserError(f"key 'map_fn' expected 'path/to/file.py:function', got {spec!r}")
    path = Path(file)
    if not path.is_file():
        raise UserError(f"key 'map_fn': file {file!r} not found")
    module_name = f"alignctl_user_map_fn_{abs(hash(str(path.resolve())))}"
    try:
        module = import_file(module_name, path)
    except Exception as exc:  # the user's module may fail in any way; report it on one line
        raise UserError(f"key 'map_fn': importing {file!r} failed: {type(exc).__name__}: {exc}") from None
    if module is None:
        raise UserError(f"key 'map_fn': {file!r} is not an importable Python file")
    fn = getattr(module, name, None)
    if fn is None:
        raise UserError(f"key 'map_fn': {file!r} has no function {name!r}")
    if not callable(fn):
        raise UserError(f"key 'map_fn': {file}:{name} is not a function (got {type(fn).__name__})")
    return fn


def _map(ctx: Context, fn: MapFn, record: Record) -> dict[str, Any] | None:
    try:
        row = fn(dict(record.data))
    except Exception as exc:  # a bad raw row usually surfaces as KeyError/ValueError in the user fn
        ctx.bad.bad(record.where, "map_fn_error", f"map_fn raised {type(exc).__name__}: {exc}")
        return None
    if row is None:
        ctx.drop("map_fn_returned_none")
        return None
    if not isinstance(row, dict):
        ctx.bad.bad(record.where, "invalid_row",
                    f"map_fn returned {type(row).__name__}, expected a dict row or None")
        return None
    return row


def build(ctx: Context) -> None:
    assert ctx.cfg.input is not None and ctx.cfg.map_fn is not None  # required by validate()
    fn = load_map_fn(ctx.cfg.map_fn)
    kind = ctx.cfg.kind
    pools: dict[str, list[Record]] = {}
    for split, path in split_files(ctx.cfg.input).items():
        pool = pools.setdefault(split, [])
        for record in ctx.track(read_records(path, ctx.bad), f"custom {split}"):
            row = _map(ctx, fn, record)
            if row is not None:
                ctx.emit(kind, record.where, row, pool, split)
    for split, rows in ctx.split_pools(pools).items():
        ctx.write(f"{split}.parquet", kind, split, rows)
