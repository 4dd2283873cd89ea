"""MATH (Hendrycks; the ``DigitalLearningGmbH/MATH-lighteval`` layout) -> RL prompt rows.

Each input row has ``problem`` and ``solution`` (optionally ``level`` and ``type``); the ground
truth is the content of the LAST ``\\boxed{...}`` (or ``\\fbox{...}``) in the solution, found by
real brace matching so ``\\boxed{\\frac{1}{2}}`` gives ``\\frac{1}{2}`` and ``\\boxed{\\{1,2\\}}``
gives ``\\{1,2\\}`` (:func:`alignctl.rewards.math_scorer.last_boxed`, shared with eval's answer votes). Prompt and data_source follow verl's
``math_dataset.py``. An empty or whitespace-only problem or solution is a bad row (the
instruction alone is not a problem).
"""

from __future__ import annotations

from typing import Any

from alignctl.data.preprocess.common import Context
from alignctl.data.readers import Record, read_records, split_files
from alignctl.data.schema import user
from alignctl.rewards.math_scorer import BoxError, last_boxed

DATA_SOURCE = "DigitalLearningGmbH/MATH-lighteval"
INSTRUCTION = "Let's think step by step and output the final answer within \\boxed{}."
FIELDS = {"problem": str, "solution": str}
OPTIONAL = {"level": str, "type": str}


def make_row(problem: str, solution: str, truth: str, data: dict[str, Any]) -> dict[str, Any]:
    return {
        "data_source": DATA_SOURCE,
        "prompt": [user(problem + " " + INSTRUCTION)],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": truth},
        # Same keys in every row (None when absent) so the parquet struct type is one type.
        "extra_info": {"question": problem, "answer": solution,
                       "level": data.get("level"), "type": data.get("type")},
    }


def build(ctx: Context) -> None:
    assert ctx.cfg.input is not None  # PreprocessConfig.validate requires it for math
    pools: dict[str, list[Record]] = {}
    for split, path in split_files(ctx.cfg.input).items():
        pool = pools.setdefault(split, [])
        for record in ctx.track(read_records(path, ctx.bad, FIELDS, OPTIONAL), f"math {split}"):
            if ctx.blank(record, FIELDS):
                continue
            solution = record.data["solution"]
            try:
                truth = last_boxed(solution)
            except BoxError as exc:
                ctx.bad.bad(record.where, "bad_boxed_answer", f"field 'solution': {exc}")
                continue
            if truth is None:
                ctx.bad.bad(record.where, "no_boxed_answer",
                            "field 'solution' expected a final answer in \\boxed{...}")
                continue
            ctx.emit("rl", record.where, make_row(record.data["problem"], solution, truth, record.data),
                     pool, split)
    for split, rows in ctx.split_pools(pools).items():
        ctx.write(f"{split}.parquet", "rl", split, rows)
