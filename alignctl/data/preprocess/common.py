"""Plumbing shared by the preprocessors: collecting rows, held-out splits, parquet writing, report.

A preprocessor reads its source, turns each raw row into a schema row and hands it to
:meth:`Context.emit` (which validates it), then calls :meth:`Context.write` per output file.
Rows dropped by design are counted with :meth:`Context.drop`; malformed input goes through
``ctx.bad`` (raise, or skip and count with ``skip_bad_rows``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from alignctl.config.preprocess import PreprocessConfig
from alignctl.data.readers import BadRows, Record
from alignctl.data.schema import SchemaError, check_row, validate_row
from alignctl.errors import UserError

T = TypeVar("T")

# Bumped whenever the rows written for the same config would change (cache keys include it).
FORMAT_VERSION = 1
META = "meta.json"


@dataclass
class PreprocessReport:
    """What a preprocess run wrote, dropped by design, and skipped as malformed."""

    out_dir: Path
    files: dict[str, int]
    dropped: dict[str, int]
    skipped: dict[str, int]
    examples: list[str]


def hash_fraction(key: str, seed: int) -> float:
    """A uniform number in [0, 1) fixed by (seed, key): the same prompt always lands in the same
    split, whatever the row order or the other rows are."""
    digest = hashlib.sha256(f"{seed}\x00{key}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64


def prompt_key(row: dict[str, Any]) -> str:
    return json.dumps(row["prompt"], ensure_ascii=False, sort_keys=True)


SYSTEM_MESSAGE_PRESENT = ("the prompt already starts with a system message; key 'system_prompt' would add a "
                          "second one (leave the key out, drop that message, or skip such rows with skip_bad_rows)")


def starts_with_system(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict) \
        and prompt[0].get("role") == "system"


def with_system_prompt(prompt: list[dict[str, str]], text: str, where: str) -> list[dict[str, str]]:
    """``prompt`` with a system message ``text`` in front. Added when a file is written, after the
    splits, so the held-out split is the same with or without it (splits hash the prompt). Rows
    that already have one were turned away (or skipped) by :meth:`Context.emit`."""
    if starts_with_system(prompt):
        raise UserError(f"{where}: {SYSTEM_MESSAGE_PRESENT}")
    return [{"role": "system", "content": text}, *prompt]


class Context:
    """One preprocess run: its config, output folder and counters."""

    def __init__(self, cfg: PreprocessConfig, out_dir: Path, *, progress: bool = True) -> None:
        self.cfg = cfg
        self.out_dir = out_dir
        self.progress = progress
        self.bad = BadRows(skip=cfg.skip_bad_rows)
        self.dropped: Counter[str] = Counter()
        self.files: dict[str, int] = {}

    def refuse_source_keys(self, test_size_key: str) -> None:
        """A generated dataset (from ``seed``) reads no input and has its own test size."""
        name = self.cfg.dataset
        if self.cfg.input is not None:
            raise UserError(f"preprocess {name}: key 'input' is not used (the data is generated from 'seed')")
        if self.cfg.test_fraction:
            raise UserError(f"preprocess {name}: key 'test_fraction' is not used; set {test_size_key} instead")

    # ------------------------------------------------------------------ rows

    def drop(self, reason: str) -> None:
        """Count a source row left out by design (never silently)."""
        self.dropped[reason] += 1

    def blank(self, record: Record, names: Iterable[str]) -> bool:
        """Report the first of ``names`` that is an empty or whitespace-only string as a bad row
        (counted as ``empty_field:NAME``); True when there was one. A blank question would still
        make a non-empty prompt once the instruction is appended, so the schema cannot catch it."""
        for name in names:
            value = record.data.get(name)
            if isinstance(value, str) and not value.strip():
                self.bad.bad(record.where, f"empty_field:{name}",
                             f"field {name!r} expected a non-empty string, got {value!r}")
                return True
        return False

    def emit(self, kind: str, where: str, row: dict[str, Any], pool: list[Record], split: str) -> None:
        """Validate ``row`` and append it to ``pool``; ``extra_info.split``/``index`` are set here
        (and renumbered on write) so every file numbers its rows 0..n-1."""
        info = row.get("extra_info")
        if info is None:
            info = {}
        if isinstance(info, dict):
            rest = {k: v for k, v in info.items() if k not in ("split", "index")}
            row["extra_info"] = {"split": split, "index": len(pool), **rest}
        try:
            check_row(kind, row)
        except SchemaError as exc:
            self.bad.bad(where, exc.reason, f"invalid {kind} row: {exc}")
            return
        if self.cfg.system_prompt is not None and starts_with_system(row.get("prompt")):
            self.bad.bad(where, "system_message_present", SYSTEM_MESSAGE_PRESENT)
            return
        pool.append(Record(where, row))

    def split_pools(self, pools: dict[str, list[Record]],
                    key: Callable[[dict[str, Any]], str] = prompt_key) -> dict[str, list[Record]]:
        """Apply ``test_fraction`` to a single-split source: rows whose hashed key falls below the
        fraction go to ``test``, the rest to ``train`` (source order kept in both)."""
        fraction = self.cfg.test_fraction
        if fraction == 0.0:
            return pools
        if len(pools) != 1:
            raise UserError(f"key 'test_fraction': the source already has splits "
                            f"{', '.join(pools)}; set test_fraction=0")
        (rows,) = pools.values()
        test = [r for r in rows if hash_fraction(key(r.data), self.cfg.seed) < fraction]
        chosen = {id(r) for r in test}
        return {"train": [r for r in rows if id(r) not in chosen], "test": test}

    # ------------------------------------------------------------------ output

    def write(self, filename: str, kind: str, split: str, rows: list[Record]) -> None:
        """Validate and write one parquet file (first ``max_rows`` rows); an empty file is an error."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        if self.cfg.max_rows is not None:
            rows = rows[: self.cfg.max_rows]
        if not rows:
            raise UserError(f"preprocess {self.cfg.dataset}: no rows left for {filename} "
                            f"(dropped: {dict(self.dropped) or 0}, skipped: {dict(self.bad.counts) or 0})")
        table_rows = []
        for index, record in enumerate(rows):
            row = dict(record.data)
            if self.cfg.system_prompt is not None:
                row["prompt"] = with_system_prompt(row["prompt"], self.cfg.system_prompt, record.where)
            row["extra_info"] = {**row["extra_info"], "split": split, "index": index}
            validate_row(kind, row, record.where)
            table_rows.append(row)
        pq.write_table(pa.Table.from_pylist(table_rows), self.out_dir / filename)
        self.files[filename] = len(table_rows)

    def write_meta(self) -> None:
        from alignctl import __version__

        meta = {
            "format_version": FORMAT_VERSION,
            "alignctl_version": __version__,
            "dataset": self.cfg.dataset,
            "config": dataclasses.asdict(self.cfg),
            "files": self.files,
            "dropped": dict(sorted(self.dropped.items())),
            "skipped": dict(sorted(self.bad.counts.items())),
        }
        (self.out_dir / META).write_text(json.dumps(meta, indent=2, ensure_ascii=False) + "\n",
                                         encoding="utf-8")

    def report(self, out_dir: Path) -> PreprocessReport:
        return PreprocessReport(out_dir=out_dir, files=dict(self.files),
                                dropped=dict(sorted(self.dropped.items())),
                                skipped=dict(sorted(self.bad.counts.items())),
                                examples=list(self.bad.examples))

    # ------------------------------------------------------------------ progress

    def track(self, items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
        """``items`` with the console's progress bar when progress is on (and stderr is a terminal)."""
        from alignctl.console import track

        yield from track(items, description, total=total, enabled=None if self.progress else False)
