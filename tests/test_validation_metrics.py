"""RL validation metrics (``val-core/<source>/acc/{mean,best,maj}@N``) on a fixed set of samples;
the expected values are worked out by hand in the comments."""

from __future__ import annotations

import pytest

from alignctl.trainers.validation import aggregate


def _records(source: str, groups: list[list[tuple[str, float]]]) -> list[dict]:
    return [{"data_source": source, "uid": uid, "response": text, "score": score}
            for uid, group in enumerate(groups) for text, score in group]


ARITH = [
    [("#### 5", 1.0), ("#### 5", 1.0), ("#### 7", 0.0)],  # best 1; majority 5 (2 votes) -> 1
    [("#### 3", 0.0), ("#### 4", 1.0), ("#### 3", 0.0)],  # best 1; majority 3 (2 votes) -> 0
    [("no answer", 0.0), ("#### 9", 0.0), ("nothing", 0.0)],  # best 0; only 9 was answered -> 0
    [("#### 2", 1.0), ("#### 8", 0.0), ("#### 6", 0.0)],  # best 1; a three-way tie: the first sampled, 2 -> 1
]


def test_mean_best_and_majority_by_hand():
    metrics = aggregate(_records("arith", ARITH), n=3)
    assert metrics == pytest.approx({
        "val-core/arith/acc/mean@3": 4 / 12,  # 1+1+0 + 0+1+0 + 0+0+0 + 1+0+0
        "val-core/arith/acc/best@3": 3 / 4,
        "val-core/arith/acc/maj@3": 2 / 4,
    })


def test_sources_are_separate_and_maj_needs_an_answer_extractor():
    hh = [[("a polite reply", 0.2), ("a rude reply", 0.9)], [("x", 0.5), ("y", 0.1)]]
    records = _records("arith", [g[:2] for g in ARITH[:2]]) + _records("Anthropic/hh-rlhf", hh)
    metrics = aggregate(records, n=2)
    assert metrics["val-core/arith/acc/mean@2"] == pytest.approx(3 / 4)  # [1, 1] and [0, 1]
    assert metrics["val-core/arith/acc/best@2"] == pytest.approx(1.0)
    assert metrics["val-core/arith/acc/maj@2"] == pytest.approx(1 / 2)  # [5, 5] -> 1; tie [3, 4] -> 3 -> 0
    assert metrics["val-core/Anthropic/hh-rlhf/acc/mean@2"] == pytest.approx((0.2 + 0.9 + 0.5 + 0.1) / 4)
    assert metrics["val-core/Anthropic/hh-rlhf/acc/best@2"] == pytest.approx((0.9 + 0.5) / 2)
    assert "val-core/Anthropic/hh-rlhf/acc/maj@2" not in metrics  # no answers to vote on


def test_one_sample_reports_only_the_mean():
    metrics = aggregate(_records("arith", [[g[0]] for g in ARITH]), n=1)
    assert metrics == pytest.approx({"val-core/arith/acc/mean@1": 2 / 4})


def test_math_majority_votes_by_the_scorers_equivalence():
    """\\frac{1}{2}, 0.5 and 1/2 are one answer to math-verify, so they outvote 3 (two votes)."""
    group = [(r"\boxed{\frac{1}{2}}", 1.0), (r"\boxed{0.5}", 1.0), (r"\boxed{1/2}", 1.0), (r"\boxed{3}", 0.0),
             (r"\boxed{3}", 0.0)]
    wrong_first = [(r"\boxed{3}", 0.0), (r"\boxed{0.5}", 1.0), (r"\boxed{1/2}", 1.0), (r"\boxed{3}", 0.0),
                   (r"\boxed{\dfrac12}", 1.0)]
    metrics = aggregate(_records("HuggingFaceH4/MATH-500", [group, wrong_first]), n=5)
    assert metrics["val-core/HuggingFaceH4/MATH-500/acc/best@5"] == pytest.approx(1.0)
    assert metrics["val-core/HuggingFaceH4/MATH-500/acc/maj@5"] == pytest.approx(1.0)
