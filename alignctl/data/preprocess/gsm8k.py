"""GSM8K -> RL prompt rows, following verl's ``examples/data_preprocess/gsm8k.py``.

Prompt = question + " " + the instruction below; ground truth = the text after ``#### `` in the
reference answer with thousands separators removed (``1,000`` -> ``1000``). An empty or
whitespace-only question or answer is a bad row.
Source: a local folder with ``train.jsonl`` / ``test.jsonl`` (or one file, a single split), or,
online, a ``datasets`` hub name (default ``openai/gsm8k``, config ``main``).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from alignctl.data.preprocess.common import Context
from alignctl.data.readers import BadRows, Record, check_fields, read_records, split_files
from alignctl.data.schema import user
from alignctl.errors import UserError
from alignctl.hub import hub_problem, is_network_problem

DATA_SOURCE = "openai/gsm8k"
HUB_CONFIG = "main"
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
FIELDS = {"question": str, "answer": str}


def extract_answer(solution: str) -> str | None:
    """The final answer of a GSM8K solution: text after the last ``#### ``, commas removed."""
    head, sep, tail = solution.rpartition("#### ")
    if not sep:
        return None
    answer = tail.strip().replace(",", "")
    return answer or None


def make_row(question: str, answer: str, ground_truth: str) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [user(question + " " + INSTRUCTION)],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"answer": answer, "question": question},
    }


def _hub_records(name: str, bad: BadRows, hint: str) -> dict[str, Iterator[Record]]:
    import datasets

    # Fail fast offline: the hub client otherwise retries for ~25 s before giving up. With
    # HF_HUB_OFFLINE set only a locally cached copy can work: datasets says whether there is one.
    why = None if datasets.config.HF_HUB_OFFLINE else hub_problem(name, "dataset", timeout=3)
    if why and is_network_problem(why):
        raise UserError(f"gsm8k: cannot reach the dataset hub to load {name!r} (offline?); "
                        f"pass --input with a local folder holding train.jsonl/test.jsonl{hint}")
    try:
        loaded = datasets.load_dataset(name, HUB_CONFIG)
    except Exception as exc:  # the hub client raises many types (ConnectionError, HfHubHTTPError, ...)
        raise UserError(f"gsm8k: cannot load {name!r} (config {HUB_CONFIG!r}) from the dataset hub: "
                        f"{type(exc).__name__}: {exc}") from None

    def rows(split: str) -> Iterator[Record]:
        for i, data in enumerate(loaded[split], start=1):
            where = f"{name}:{split}:row {i}"
            problem = check_fields(data, FIELDS)
            if problem is None:
                yield Record(where, dict(data))
            else:
                bad.bad(where, *problem)

    return {split: rows(split) for split in ("train", "test") if split in loaded}


def _sources(ctx: Context) -> dict[str, Iterator[Record]]:
    source = ctx.cfg.input
    if source is not None and Path(source).exists():
        files = split_files(source)
        return {split: read_records(path, ctx.bad, FIELDS) for split, path in files.items()}
    if source is not None and (source.startswith((".", "/", "~")) or source.count("/") != 1):
        raise UserError(f"{source}: input not found (expected a local folder/file or a hub name "
                        f"like {DATA_SOURCE})")
    hint = "" if source is None else f" (no local path {source!r} either)"
    return _hub_records(source or DATA_SOURCE, ctx.bad, hint)


def build(ctx: Context) -> None:
    pools: dict[str, list[Record]] = {}
    for split, records in _sources(ctx).items():
        pool = pools.setdefault(split, [])
        for record in ctx.track(records, f"gsm8k {split}"):
            if ctx.blank(record, FIELDS):
                continue
            question, answer = record.data["question"], record.data["answer"]
            truth = extract_answer(answer)
            if truth is None:
                ctx.bad.bad(record.where, "no_final_answer",
                            "field 'answer' expected a final line '#### <number>'")
                continue
            ctx.emit("rl", record.where, make_row(question, answer, truth), pool, split)
    for split, rows in ctx.split_pools(pools).items():
        ctx.write(f"{split}.parquet", "rl", split, rows)
