"""GSM8K scorer and the data_source registry: the real test split, perturbations, number formats."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from alignctl.errors import UserError
from alignctl.rewards import gsm8k_scorer as gsm8k
from alignctl.rewards.rule_scorers import answer_format_share, default_compute_score, scorer_name


def _test_rows(shared_data: Path) -> list[dict[str, str]]:
    path = shared_data / "gsm8k" / "test.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _ground_truth(answer: str) -> str:
    # The preprocessing contract: text after "#### " with commas removed.
    return answer.split("#### ")[-1].replace(",", "").strip()


def test_every_reference_solution_of_the_test_split_scores_one(shared_data: Path) -> None:
    rows = _test_rows(shared_data)
    assert len(rows) == 1319
    failures = [i for i, row in enumerate(rows) if gsm8k.compute_score(row["answer"], _ground_truth(row["answer"])) != 1.0]
    assert failures == []


def test_perturbed_reference_solutions_score_zero(shared_data: Path) -> None:
    rows = _test_rows(shared_data)
    off_by_one = [
        i for i, row in enumerate(rows)
        if gsm8k.compute_score(row["answer"], str(Decimal(_ground_truth(row["answer"])) + 1)) != 0.0
    ]
    assert off_by_one == []
    # Without the "####" line strict mode finds no answer at all, even though numbers remain.
    without_marker = [row["answer"].rsplit("\n####", 1)[0] for row in rows]
    assert all("####" not in text for text in without_marker)
    assert [i for i, text in enumerate(without_marker) if gsm8k.compute_score(text, _ground_truth(rows[i]["answer"])) != 0.0] == []
    assert all(gsm8k.extract_answer(text, "strict") is None for text in without_marker)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so #### 18.0", "18", 1.0),
        ("so #### 18", "18.0", 1.0),
        ("so #### $18", "18", 1.0),
        ("so #### 18.", "18", 1.0),
        ("so #### 1,800", "1800", 1.0),
        ("so #### 1800", "1,800", 1.0),
        ("so #### -3", "-3", 1.0),
        ("so #### $-3", "-3", 1.0),
        ("so #### -$3", "-3", 1.0),
        ("so #### 3", "-3", 0.0),
        ("so #### 0.50", ".5", 1.0),
        ("so #### .5", "0.5", 1.0),
        ("so ####18", "18", 1.0),
        ("#### 17 wait, no: #### 18", "18", 1.0),  # the last marker wins
        ("#### 18 wait, no: #### 17", "18", 0.0),
        ("so #### 18", "eighteen", 0.0),  # unparsable ground truth is never equal
        ("the answer is 18", "18", 0.0),  # strict needs the marker
    ],
)
def test_number_formats_compare_as_numbers(response: str, truth: str, expected: float) -> None:
    assert gsm8k.compute_score(response, truth) == expected


def test_format_score_rewards_an_extracted_but_wrong_answer_only() -> None:
    assert gsm8k.compute_score("#### 17", "18", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no marker 18", "18", format_score=0.1) == 0.0
    assert gsm8k.compute_score("#### 18", "18", format_score=0.1, score=2.0) == 2.0


def test_flexible_takes_the_last_number() -> None:
    assert gsm8k.extract_answer("3 apples and 4 pears make 7.", "flexible") == "7"
    assert gsm8k.extract_answer("It costs $1,800 in total", "flexible") == "$1,800"
    # "1,2,3" is a list, not the number 123.
    assert gsm8k.extract_answer("the sequence 1,2,3", "flexible") == "3"
    assert gsm8k.compute_score("so she pays $1,800.", "1800", method="flexible") == 1.0
    assert gsm8k.extract_answer("no numbers at all", "flexible") is None


def test_only_the_end_of_a_long_response_is_read() -> None:
    filler = "and then we think about it some more " * 20  # 740 characters, no digits
    assert len(filler) > gsm8k.CLIP_CHARS
    # An answer followed by a long tail is outside the window: no answer.
    assert gsm8k.extract_answer("#### 18 " + filler, "strict") is None
    assert gsm8k.extract_answer("it is 18 " + filler, "flexible") is None
    # Stray numbers early in a long response do not matter; the final marker does.
    noisy = "#### 99 " + " ".join(str(i) for i in range(5000)) + " #### 18"
    assert gsm8k.compute_score(noisy, "18") == 1.0


def test_parse_number_rejects_non_finite_and_junk() -> None:
    assert gsm8k.parse_number("$1,800.") == Decimal(1800)
    assert gsm8k.parse_number("NaN") is None
    assert gsm8k.parse_number("Infinity") is None
    assert gsm8k.parse_number("--3") is None
    assert gsm8k.parse_number("") is None
    with pytest.raises(ValueError, match="unknown GSM8K extraction method"):
        gsm8k.extract_answer("#### 1", "loose")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("openai/gsm8k", "gsm8k"),
        ("gsm8k", "gsm8k"),
        ("arith", "gsm8k"),
        ("lighteval/MATH", "math"),
        ("DigitalLearningGmbH/MATH-lighteval", "math"),
        ("HuggingFaceH4/MATH-500", "math"),
        ("math", "math"),
    ],
)
def test_registry_dispatch_by_data_source(source: str, expected: str) -> None:
    assert scorer_name(source) == expected


def test_registry_scores_gsm8k_style_sources_strictly() -> None:
    for source in ("openai/gsm8k", "gsm8k", "arith"):
        assert default_compute_score(source, "2 + 3 = 5\n#### 5", "5", {"index": 0}) == 1.0
        assert default_compute_score(source, "2 + 3 = 5", "5") == 0.0  # flexible would say 1


def test_unknown_data_source_is_a_user_error_naming_it_and_the_known_ones() -> None:
    with pytest.raises(UserError) as info:
        default_compute_score("my/custom-set", "#### 5", "5")
    message = str(info.value)
    assert "'my/custom-set'" in message and "openai/gsm8k" in message and "arith" in message
    assert "\n" not in message


def test_answer_format_share_counts_gsm8k_family_answers_right_or_wrong():
    """Hand count: of the three arith/gsm8k rows, '#### 2' (right) and '#### 5' (wrong) are in the
    strict form and the third has no '####' answer -> 2/3; the custom-source row is not counted."""
    sources = ["arith", "gsm8k", "arith", "my_task"]
    texts = ["1 + 1 = 2. #### 2", "#### 5", "the answer is 7", "#### 3"]
    assert answer_format_share(sources, texts) == pytest.approx(2 / 3)
    assert answer_format_share(["my_task"], ["#### 3"]) is None
