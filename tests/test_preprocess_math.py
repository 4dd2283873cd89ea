"""MATH -> RL parquet: last-\\boxed{} extraction with real brace matching, the shipped fixture."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from alignctl.config.core import build_config
from alignctl.config.preprocess import PreprocessConfig
from alignctl.data.preprocess import PreprocessReport, run_preprocess
from alignctl.data.preprocess.math import INSTRUCTION
from alignctl.errors import UserError
from alignctl.rewards.math_scorer import BoxError, last_boxed

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "math_sample.jsonl"

# The answer of each fixture problem, worked out by hand from the problem text (not read from the
# solutions), in file order.
FIXTURE_ANSWERS = [
    r"\frac{5}{6}",            # 1/2 + 1/3 = 3/6 + 2/6
    r"\{-1, 1\}",              # x^2 = 1
    "7",                       # sqrt 49
    r"5\sqrt{2}",              # sqrt 50 = sqrt(25 * 2)
    "1024",                    # 2^10
    "4",                       # 2x + 3 = 11
    "9",                       # (1 + 2)^2; an earlier \boxed{3} is not the last box
    "12",                      # 3 * 4, written with \fbox
    "5",                       # 10 / 2, written `\boxed 5`
    "(-2,2)",                  # x^2 < 4
    r"\frac{\sqrt{3}}{2}",     # sin 60
    r"\text{(C)}",             # 7 is the prime
    r"\begin{pmatrix} 1 \\ 2 \end{pmatrix}",  # (1, 0) + (0, 2); `\\` is a row break, not an escape
    "10",                      # C(5, 2) = 5 * 4 / 2
    "6",                       # gcd(12, 18)
    "32",                      # 2^5
    r"\dfrac{1}{3}",           # 0.333...
    "12",                      # 0.15 * 80
    "720",                     # 180 * (6 - 2)
    r"x^{2} + 1",              # (x + i)(x - i) = x^2 - i^2
    r"\left(2, 3\right)",      # midpoint of (0,0) and (4,6)
    r"\frac{3}{2}",            # x / 3 = 1 / 2
]


def _run(out: Path, **keys: Any) -> PreprocessReport:
    cfg = build_config(PreprocessConfig, {"dataset": "math", "out": str(out), **keys})
    return run_preprocess(cfg, progress=False)


@pytest.mark.parametrize(("solution", "expected"), [
    (r"so $x = \boxed{4}$.", "4"),
    (r"$\boxed{\frac{1}{2}}$", r"\frac{1}{2}"),
    (r"$\boxed{\{1,2\}}$", r"\{1,2\}"),
    (r"$\boxed{\}}$ is odd but legal", r"\}"),             # an escaped brace does not close
    (r"$\boxed{a}$ then $\boxed{b_{1}}$", "b_{1}"),         # the last box wins
    (r"$\boxed{1}$ or $\fbox{2}$", "2"),
    (r"the answer is $\boxed 5$.", "5"),
    (r"$\boxed {  7 }$", "7"),
    (r"$\boxed{\begin{matrix} 1 \\ 2 \end{matrix}}$", r"\begin{matrix} 1 \\ 2 \end{matrix}"),
    (r"$\boxed{\boxed{3}}$", "3"),
    (r"no box at all", None),
    (r"\boxedx is not a box", None),
])
def test_last_boxed(solution: str, expected: str | None) -> None:
    assert last_boxed(solution) == expected


@pytest.mark.parametrize(("solution", "message"), [
    (r"$\boxed{\frac{1}{2}$", "unbalanced braces"),
    (r"$\boxed{ }$", "empty"),
])
def test_malformed_box_raises(solution: str, message: str) -> None:
    with pytest.raises(BoxError, match=message):
        last_boxed(solution)


def test_fixture_ground_truths(tmp_path: Path) -> None:
    report = _run(tmp_path / "o", input=str(FIXTURE))
    assert report.files == {"train.parquet": len(FIXTURE_ANSWERS)}
    df = pd.read_parquet(tmp_path / "o" / "train.parquet")
    assert [r["ground_truth"] for r in df["reward_model"]] == FIXTURE_ANSWERS
    first = df.iloc[0]
    assert first["data_source"] == "DigitalLearningGmbH/MATH-lighteval"
    assert list(first["prompt"]) == [{"role": "user", "content": r"What is $\frac{1}{2} + \frac{1}{3}$? "
                                      + INSTRUCTION}]
    assert INSTRUCTION == r"Let's think step by step and output the final answer within \boxed{}."
    assert first["extra_info"]["level"] == "Level 1" and first["extra_info"]["type"] == "Prealgebra"
    assert df.iloc[-1]["extra_info"]["level"] is None  # the last fixture row has no level/type


def test_folder_with_splits_and_bad_rows(tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    lines = FIXTURE.read_text().splitlines()
    (src / "train.jsonl").write_text("\n".join(lines[:15]) + "\n")
    bad = [json.dumps({"problem": "p", "solution": "the answer is 3"}),
           json.dumps({"problem": "p", "solution": r"$\boxed{3$"})]
    (src / "test.jsonl").write_text("\n".join(lines[15:] + bad) + "\n")
    with pytest.raises(UserError) as info:
        _run(tmp_path / "o", input=str(src))
    assert str(info.value) == (f"{src / 'test.jsonl'}:8: field 'solution' expected a final answer "
                               r"in \boxed{...}")
    report = _run(tmp_path / "o", input=str(src), skip_bad_rows=True)
    assert report.files == {"train.parquet": 15, "test.parquet": 7}
    assert report.skipped == {"bad_boxed_answer": 1, "no_boxed_answer": 1}
    assert report.examples[1] == (f"{src / 'test.jsonl'}:9: field 'solution': unbalanced braces in "
                                  r"the last \boxed{...}")
    test = pd.read_parquet(tmp_path / "o" / "test.parquet")
    assert [r["ground_truth"] for r in test["reward_model"]] == FIXTURE_ANSWERS[15:]
