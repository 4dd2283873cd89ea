"""Human-facing console output of the CLI: summary tables and progress bars (rich)."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

T = TypeVar("T")

# Logs and CI captures are not 80 columns wide; a wider default keeps tables readable there.
console = Console(stderr=False, highlight=False, width=None if sys.stdout.isatty() else 140)


def progress_enabled() -> bool:
    """Progress bars only for a person at a terminal, never in CI logs."""
    return sys.stderr.isatty() and not os.environ.get("CI")


def progress_bar() -> Progress:
    """The one progress-bar look: description, bar, done/total, elapsed time, on stderr, erased
    when finished. Used by :func:`track` and by the SFT/RM trainer callback; whether to show one at
    all is the caller's ``progress`` flag, defaulting to :func:`progress_enabled`."""
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    return Progress(*columns, console=Console(stderr=True), transient=True)


def running_lines(enabled: bool | None = None) -> Progress:
    """One spinner line per running job with its time so far (stages side by side), on stderr, erased
    when done; shown only for a person at a terminal unless ``enabled`` says otherwise."""
    columns = (SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn())
    return Progress(*columns, console=Console(stderr=True), transient=True,
                    disable=not (progress_enabled() if enabled is None else enabled))


# Under the command line (cli.main turns it on), a loop without a progress bar (output piped to a
# file, CI) prints a plain line now and then instead of nothing; a library caller's stays silent.
PLAIN_EVERY_S = 30.0
_plain_lines = False


def plain_progress_lines(on: bool) -> None:
    global _plain_lines
    _plain_lines = on


def track(items: Iterable[T], description: str, total: int | None = None,
          enabled: bool | None = None) -> Iterator[T]:
    """Iterate with a :func:`progress_bar` (``None``: only for a person at a terminal). Without a bar:
    under the command line, ``description: done/total (elapsed)`` on stderr every
    :data:`PLAIN_EVERY_S` seconds (a loop shorter than that prints nothing); else silently."""
    if not (progress_enabled() if enabled is None else enabled):
        yield from (_plain_periodic(items, description, total) if _plain_lines else items)
        return
    with progress_bar() as bar:
        task = bar.add_task(description, total=total if total is not None else _len(items))
        for item in items:
            yield item
            bar.advance(task)


def _plain_periodic(items: Iterable[T], description: str, total: int | None,
                    clock: Any = time.monotonic) -> Iterator[T]:
    total = total if total is not None else _len(items)
    start = clock()
    due = start + PLAIN_EVERY_S
    for done, item in enumerate(items, 1):
        yield item
        now = clock()
        if now >= due:
            due = now + PLAIN_EVERY_S
            count = f"{done}/{total}" if total else str(done)
            print(f"{description}: {count} ({int(now - start)}s)", file=sys.stderr, flush=True)


def _len(items: Any) -> int | None:
    try:
        return len(items)
    except TypeError:
        return None


def clip(line: str, width: int) -> str:
    """``line`` cut to ``width`` columns, an ellipsis marking the cut (one screen line each)."""
    return line if len(line) <= width else line[: width - 1] + "…"


def print_table(title: str, columns: list[str], rows: list[list[Any]]) -> None:
    table = Table(title=title, title_justify="left")
    for name in columns:
        table.add_column(name)
    for row in rows:
        table.add_row(*(str(v) for v in row))
    console.print(table)


def print_preprocess_report(report: Any) -> None:
    """Row counts per written file, then anything dropped or skipped (never silently)."""
    print_table(f"wrote {report.out_dir}", ["file", "rows"], [[k, v] for k, v in report.files.items()])
    if report.dropped:
        print_table("dropped by design", ["reason", "rows"], [[k, v] for k, v in report.dropped.items()])
    if report.skipped:
        print_table("skipped bad rows", ["reason", "rows"], [[k, v] for k, v in report.skipped.items()])
        for example in report.examples:
            console.print(f"  e.g. {example}")
