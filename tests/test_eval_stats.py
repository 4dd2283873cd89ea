"""Pure statistics of the eval stage: win rate, bootstrap CI, length control, pass@k / maj@k, and
rule accuracy on a hand-counted fixture (real GSM8K scorer, no models)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from alignctl.eval import stats
from alignctl.eval.accuracy import rule_accuracy
from alignctl.eval.data import PromptRow
from alignctl.rewards.rule_scorers import default_vote_keys


def _logit(p: float) -> float:
    return math.log(p / (1 - p))


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 1 / (1 + np.exp(-z))


# ------------------------------------------------------------------------------- win rate


def test_pair_outcomes_and_win_score_by_hand() -> None:
    policy = np.array([[1.0, 3.0]])
    reference = np.array([[2.0, 3.0]])
    # pairs (1 vs 2) loss 0, (1 vs 3) loss 0, (3 vs 2) win 1, (3 vs 3) tie 0.5 -> 1.5 / 4 = 0.375
    assert stats.pair_outcomes(policy, reference).tolist() == [[[0.0, 0.0], [1.0, 0.5]]]
    assert stats.win_scores(policy, reference).tolist() == [0.375]


def test_identical_scores_are_all_ties() -> None:
    rewards = np.array([[0.3], [-1.2], [2.0]])
    scores = stats.win_scores(rewards, rewards.copy())
    assert scores.tolist() == [0.5, 0.5, 0.5]
    assert stats.bootstrap_ci(scores, num_resamples=200, seed=0) == (0.5, 0.5)


def test_bootstrap_is_seeded() -> None:
    values = np.random.default_rng(1).random(50)
    a = stats.bootstrap_ci(values, num_resamples=500, seed=7)
    assert a == stats.bootstrap_ci(values, num_resamples=500, seed=7)
    assert a != stats.bootstrap_ci(values, num_resamples=500, seed=8)
    assert a[0] < values.mean() < a[1]


def test_bootstrap_ci_covers_the_truth_about_95_percent_of_the_time() -> None:
    # 400 synthetic evaluations of 60 prompts whose per-prompt outcome is loss/tie/win with
    # probabilities 0.3/0.2/0.5, so the true win rate is 0.2 * 0.5 + 0.5 = 0.6. The number of
    # intervals covering 0.6 is Binomial(400, ~0.95): sd = sqrt(400 * .95 * .05) = 4.4 intervals, so
    # [364, 394] is the nominal 95% +- 3.4 sd (the percentile bootstrap runs slightly below
    # nominal at 60 samples, hence the slightly wider low side).
    rng = np.random.default_rng(2024)
    truth, covered = 0.6, 0
    for trial in range(400):
        scores = rng.choice([0.0, 0.5, 1.0], p=[0.3, 0.2, 0.5], size=60)
        low, high = stats.bootstrap_ci(scores, num_resamples=1000, seed=trial)
        covered += low <= truth <= high
    assert 364 <= covered <= 394, covered


# ------------------------------------------------------------------------- length control


def test_length_control_recovers_intercept_on_noise_free_targets() -> None:
    # Targets are the exact win probabilities sigmoid(a + 0.8 * d): the log-loss minimum is the true
    # parameters, so the fit returns sigmoid(a) = 0.6 up to the vanishing ridge on the slope.
    rng = np.random.default_rng(0)
    d = rng.normal(1.0, 1.0, size=2000)  # the policy is longer on average
    y = _sigmoid(_logit(0.6) + 0.8 * d)
    fit = stats.length_controlled_win_rate(y, d)
    assert fit.win_rate == pytest.approx(0.6, abs=1e-5)
    assert fit.slope * 1 / fit.scale == pytest.approx(0.8, rel=1e-4)  # slope is per std of d
    assert y.mean() > 0.72  # the raw win rate is inflated by the length bias


def test_length_control_recovers_unbiased_win_rate_from_noisy_outcomes() -> None:
    # Outcomes drawn as Bernoulli(sigmoid(a + b * d)) with a true length-free win rate of 0.6 and a
    # strong length bias. Tolerance = 4 standard errors of sigmoid(a-hat), from the Fisher
    # information X^T W X at the true parameters (delta method: se_p = p (1 - p) se_a).
    rng = np.random.default_rng(1)
    a, b, n = _logit(0.6), 1.2, 20000
    d = rng.normal(0.8, 1.0, size=n)
    p = _sigmoid(a + b * d)
    y = (rng.random(n) < p).astype(float)
    x = np.stack([np.ones(n), d], axis=1)
    info = (x * (p * (1 - p))[:, None]).T @ x
    se = 0.6 * 0.4 * math.sqrt(np.linalg.inv(info)[0, 0])
    fit = stats.length_controlled_win_rate(y, d)
    assert abs(fit.win_rate - 0.6) < 4 * se, (fit.win_rate, se)
    assert y.mean() > 0.72  # raw win rate, far from 0.6
    assert fit.slope > 0


def test_length_control_degenerate_inputs() -> None:
    d = np.linspace(-1, 1, 101)
    assert stats.length_controlled_win_rate(np.ones(101), d).win_rate == 1.0
    assert stats.length_controlled_win_rate(np.zeros(101), d).win_rate == 0.0
    assert stats.length_controlled_win_rate(np.full(101, 0.5), d).win_rate == 0.5
    # Perfectly separated by the sign of the length difference, symmetric around 0: the ridge keeps
    # the slope finite and the win rate at equal length is 1/2 by symmetry.
    d = np.concatenate([-np.arange(1, 51), np.arange(1, 51)]).astype(float)
    y = (d > 0).astype(float)
    fit = stats.length_controlled_win_rate(y, d)
    assert math.isfinite(fit.slope) and fit.slope > 5
    assert fit.win_rate == pytest.approx(0.5, abs=1e-9)


# ------------------------------------------------------------------------------ accuracy


def _pass_at_k_brute_force(n: int, c: int, k: int) -> float:
    """Independent slow reference: enumerate every k-subset of n samples, c of them correct."""
    samples = [True] * c + [False] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    return sum(any(samples[i] for i in s) for s in subsets) / len(subsets)


def test_pass_at_k_by_hand_and_against_enumeration() -> None:
    assert stats.pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert stats.pass_at_k(5, 2, 1) == pytest.approx(0.4)  # c / n
    assert stats.pass_at_k(4, 0, 4) == 0.0
    assert stats.pass_at_k(4, 1, 4) == 1.0
    for n in range(1, 8):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert stats.pass_at_k(n, c, k) == pytest.approx(_pass_at_k_brute_force(n, c, k), abs=1e-12)
    with pytest.raises(ValueError):
        stats.pass_at_k(4, 5, 1)


def test_majority_vote() -> None:
    assert stats.majority_correct(["7", "3", "7", None], [True, False, True, False]) is True
    assert stats.majority_correct(["3", "7"], [False, True]) is False  # 1-1 tie: first seen wins
    assert stats.majority_correct([None, None], [False, False]) is False
    assert stats.majority_correct([None, "5", "5", "9", "9", "9"], [False, False, False, True, True, True]) is True


def test_accuracy_table_hand_count() -> None:
    correct = [[True, False, False, False], [True, True, False, False], [False] * 4]
    answers = [[9, 5, 5, 5], [4, 4, 2, None], [None] * 4]
    table = stats.accuracy_table(correct, answers)
    # pass@1 = mean(1/4, 2/4, 0) = 0.25
    # pass@2 = mean(1 - C(3,2)/C(4,2), 1 - C(2,2)/C(4,2), 0) = mean(1/2, 5/6, 0) = 4/9
    # pass@4 = mean(1, 1, 0) = 2/3; maj@4: 5 (wrong), 4 (right), none -> 1/3
    assert table == pytest.approx({"pass@1": 0.25, "pass@2": 4 / 9, "pass@4": 2 / 3, "maj@4": 1 / 3, "num_prompts": 3.0})
    assert stats.k_values(8) == [1, 2, 4, 8]
    assert stats.k_values(6) == [1, 2, 4, 6]
    assert "maj@1" not in stats.accuracy_table([[True], [False]], [[1], [2]])


def test_rule_accuracy_hand_count_with_the_real_scorer() -> None:
    rows = [
        PromptRow(0, [{"role": "user", "content": "q0"}], "arith", "9"),
        PromptRow(1, [{"role": "user", "content": "q1"}], "arith", "4"),
        PromptRow(2, [{"role": "user", "content": "q2"}], "arith", "3"),
        PromptRow(3, [{"role": "user", "content": "q3"}], "gsm8k", "1800"),
        PromptRow(4, [{"role": "user", "content": "free text"}]),  # no ground truth
        PromptRow(5, [{"role": "user", "content": "q5"}], "mystery-source", "1"),  # no rule scorer
    ]
    texts = [
        ["4 + 5 = 9. #### 9", "#### 5", "#### 5", "so #### 5"],  # 1 correct; majority 5 wrong
        ["#### 4", "#### 4.0", "#### 2", "four"],  # 2 correct; majority 4 right (4 == 4.0)
        ["no answer"] * 4,  # 0 correct
        # 1,800 and 1800.0 vote together (2 votes) against 7 (2 votes); 1,800 came first -> right.
        ["#### 1,800", "#### 7", "#### 1800.0", "#### 7"],
        ["#### 1"] * 4,
        ["#### 1"] * 4,
    ]
    table, correct = rule_accuracy(rows, texts)
    assert correct[:4] == [[True, False, False, False], [True, True, False, False], [False] * 4,
                           [True, False, True, False]]
    assert correct[4] is None and correct[5] is None
    assert table["arith"] == pytest.approx({"pass@1": 0.25, "pass@2": 4 / 9, "pass@4": 2 / 3, "maj@4": 1 / 3,
                                            "num_prompts": 3.0})
    # gsm8k: c = 2 of 4 -> pass@1 1/2, pass@2 1 - C(2,2)/C(4,2) = 5/6, pass@4 1, maj@4 1
    assert table["gsm8k"] == pytest.approx({"pass@1": 0.5, "pass@2": 5 / 6, "pass@4": 1.0, "maj@4": 1.0,
                                            "num_prompts": 1.0})
    # all four prompts: pass@1 = (1 + 2 + 0 + 2) / 16; maj@4 = 2 / 4
    assert table["all"]["pass@1"] == pytest.approx(5 / 16)
    assert table["all"]["maj@4"] == pytest.approx(0.5)


def test_answer_keys() -> None:
    assert default_vote_keys("gsm8k", ["#### $1,800", "#### 1800.00", "1800"]) == [1800, 1800, None]  # strict: no ####
    keys = default_vote_keys("math", [r"so \boxed{\frac{1}{2}} and finally \boxed{ 3 }", r"\boxed{\frac{1}{ 2}}",
                                      r"\boxed{unclosed", "no box"])
    assert keys == ["3", r"\frac{1}{2}", None, None]


MATH_SOURCE = "HuggingFaceH4/MATH-500"


def _math_rows(*truths: str) -> list[PromptRow]:
    return [PromptRow(i, [{"role": "user", "content": f"q{i}"}], MATH_SOURCE, t) for i, t in enumerate(truths)]


def test_math_majority_votes_by_math_verify_equivalence() -> None:
    """1/2 written three ways outvotes 3 written twice: the vote groups answers the scorer calls
    equal, not equal strings (which would make 3, with 2 votes, the majority)."""
    samples = [r"\boxed{\frac{1}{2}}", r"so $\boxed{0.5}$", r"\boxed{1/2}", r"\boxed{3}", r"\boxed{ 3}"]
    assert default_vote_keys(MATH_SOURCE, samples) == [r"\frac{1}{2}"] * 3 + ["3", "3"]
    table, correct = rule_accuracy(_math_rows(r"\frac{1}{2}"), [samples])
    assert correct == [[True, True, True, False, False]]
    assert table[MATH_SOURCE]["maj@5"] == 1.0  # the 1/2 group (3 votes) wins, and it is right
    assert table[MATH_SOURCE]["pass@1"] == pytest.approx(0.6)


def test_math_votes_read_fbox_and_escaped_braces() -> None:
    """The eval path extracts answers with the preprocessor's last_boxed: ``\\fbox`` counts, and an
    escaped brace neither opens nor closes the box."""
    assert default_vote_keys(MATH_SOURCE, [r"so $\fbox{2}$", r"\boxed{2.0}"]) == ["2", "2"]
    assert default_vote_keys(MATH_SOURCE, [r"\boxed{\left\{1, 2\right.}"]) == [r"\left\{1,2\right."]
    assert default_vote_keys(MATH_SOURCE, [r"$\boxed{\}}$"]) == [r"\}"]
    # two \fbox{2} against one \boxed{3}: 2 is the majority, and it is right
    table, _ = rule_accuracy(_math_rows("2"), [[r"$\fbox{2}$", r"\boxed{3}", r"thus \fbox{2}."]])
    assert table[MATH_SOURCE]["maj@3"] == 1.0


def test_quantiles_linear_interpolation() -> None:
    # numpy linear interpolation on [1..5]: p10 sits at index 0.4 -> 1.4, p90 at 3.6 -> 4.6
    assert stats.quantiles([5, 1, 3, 2, 4]) == pytest.approx({"p10": 1.4, "p25": 2.0, "p50": 3.0, "p75": 4.0, "p90": 4.6})


def test_rule_agreement_hand_computed() -> None:
    """Only pairs where exactly one answer is right count; the right one's outcome by the scores."""
    # prompt 0 (n = 2, m = 2): policy [right 0.9, wrong 0.1], reference [wrong 0.5, right 0.5].
    #   (p0 right, r0 wrong): 0.9 > 0.5 -> 1;   (p0 right, r1 right): not decisive
    #   (p1 wrong, r0 wrong): not decisive;     (p1 wrong, r1 right): reference right, 0.5 > 0.1 -> 1
    # prompt 1: no ground truth (left out, whatever its scores)
    # prompt 2: policy [wrong 0.7, wrong 0.3], reference [right 0.3, wrong 0.0]
    #   (p0, r0): reference right but 0.3 < 0.7 -> 0;  (p1, r0): 0.3 == 0.3 -> 0.5;  r1 wrong: not decisive
    policy = np.array([[0.9, 0.1], [5.0, 5.0], [0.7, 0.3]])
    reference = np.array([[0.5, 0.5], [0.0, 0.0], [0.3, 0.0]])
    agreement, pairs = stats.rule_agreement(policy, reference, [[True, False], None, [False, False]],
                                            [[False, True], None, [True, False]])
    assert pairs == 4
    assert agreement == pytest.approx((1 + 1 + 0 + 0.5) / 4, abs=1e-12)
    # The same answers marked alike everywhere: no decisive pair.
    assert stats.rule_agreement(policy, reference, [[True, True]] * 3, [[True, True]] * 3) == (None, 0)
    # A scorer that is the rule itself agrees fully; its negation never.
    marks_p, marks_r = [[True, False], [False, True]], [[False, False], [True, True]]
    rule_p = np.array(marks_p, dtype=float)
    rule_r = np.array(marks_r, dtype=float)
    assert stats.rule_agreement(rule_p, rule_r, marks_p, marks_r) == (1.0, 4)
    assert stats.rule_agreement(-rule_p, -rule_r, marks_p, marks_r) == (0.0, 4)
