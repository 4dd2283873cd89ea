"""Degenerate-repetition counting (alignctl.eval.repetition): hand-made texts, the warning's
threshold, and eval's plumbing of the two rates into its results and warnings."""

from __future__ import annotations

import pytest

from alignctl.eval.repetition import RISE, is_repetitive, repetition_rate, repetition_warning


@pytest.mark.parametrize(("text", "expected"), [
    ("I'm a man. I'm a man. I'm a man. I'm a man.", True),  # "I'm a man. I'm" at words 0, 3, 6
    ("I'm a man. I'm a man. I'm a man.", False),  # each 4-word phrase at most twice (words 0 and 3)
    ("the cat sat on the mat and the cat sat on the hat, the cat sat on", True),  # "the cat sat on" x3
    ("a b c d a b c e a b c f", False),  # "a b c" x3, but no 4-word phrase repeats
    ("yes yes yes yes yes yes", True),  # overlapping occurrences count: "yes yes yes yes" x3
    ("yes yes yes yes yes", False),  # ... x2
    ("", False),
    ("too short", False),
])
def test_is_repetitive_by_hand(text: str, expected: bool) -> None:
    assert is_repetitive(text) is expected


def test_rate_and_warning_threshold() -> None:
    texts = ["no repeats here at all", "go go go go go go", "fine answer", "go go go go go go"]
    assert repetition_rate(texts) == 0.5 and repetition_rate([]) == 0.0
    assert repetition_warning(0.5, None) is None  # no reference to compare with
    assert repetition_warning(0.1 + RISE - 0.01, 0.1) is None
    line = repetition_warning(0.263, 0.103)
    assert line is not None and "26.3%" in line and "10.3%" in line and "\n" not in line
