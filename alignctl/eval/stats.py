"""Pure statistics of the eval stage (numpy only: no models, no config, no files).

Notation
--------
``P`` prompts, ``n`` samples per prompt and model. ``r_p[i, j]`` / ``r_r[i, k]``: reward-model
scores of policy sample ``j`` and reference sample ``k`` of prompt ``i``.

Win rate. Every policy sample of a prompt is compared with every reference sample of the same
prompt (``n * n`` pairs): a pair scores 1 when the policy's reward is higher, 1/2 on a tie, 0
otherwise. A prompt's win score ``w[i]`` is the mean over its pairs, and the win rate is
``mean_i w[i]``, an unbiased estimate of P(policy sample beats reference sample) on this prompt
distribution. Using all ``n * n`` pairs (not only ``j == k``) lowers the variance for free.

Confidence interval. Pairs of one prompt are not independent, so the bootstrap resamples prompts
(with replacement, ``B`` times, seeded) and reports the 2.5% / 97.5% percentiles of the resampled
win rates (the percentile bootstrap, Efron & Tibshirani 1993, ch. 13).

Length-controlled win rate. A reward model that likes long answers makes a verbose policy look
better than it is. We fit the logistic regression

    P(policy wins pair) = sigmoid(a + b * x),    x = (len_policy - len_reference) / s

on all pairs (target 1 / 0.5 / 0 as above, i.e. the Bernoulli log-likelihood with fractional
targets; ``s`` = the standard deviation of the length differences, for conditioning only) and
report ``sigmoid(a)``: the predicted win probability of a response exactly as long as the
reference's. This is the core of AlpacaEval 2's length-controlled win rate (Dubois et al. 2024),
without its per-instruction terms. ``b`` is fitted with a vanishing ridge penalty so that a
perfectly length-separated data set still has a finite answer.

pass@k (Chen et al. 2021, eq. 1): with ``c`` correct among ``n`` samples, the unbiased estimate of
"at least one of k draws without replacement is correct" is ``1 - C(n-c, k) / C(n, k)``, computed
as the product ``prod_{i=n-c+1}^{n} (1 - k/i)`` so that no binomial coefficient overflows.

Rule agreement. On the pairs where the rule scorer marks exactly one side right (decisive pairs), the
share in which a reward model scores the right answer higher (ties 1/2): 1 is a judge that sees
correctness perfectly, 1/2 one that is blind to it. It bounds what that model's win rate can show:
when the non-decisive pairs average 1/2, its win rate is ``1/2 + (a - b) * (d - 1/2)`` with ``a``
(``b``) the share of pairs where only the policy (only the reference) is right and ``d`` the
agreement, so a judge at d = 0.6 turns a 20-point accuracy gain (a - b = 0.2) into a win rate of 0.52.

maj@k: the answer given most often among the ``k = n`` samples (ties: the answer that appeared
first) decides the prompt; samples without an extractable answer do not vote.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np

QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
# Resamples held in memory at once by the bootstrap ([chunk, P] int64 indices).
_BOOTSTRAP_CHUNK = 256


# ------------------------------------------------------------------------------------ win rate


def pair_outcomes(policy: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """1 / 0.5 / 0 for every (policy sample, reference sample) pair of each prompt.

    policy [P, n], reference [P, m] -> [P, n, m]."""
    diff = np.asarray(policy, dtype=np.float64)[:, :, None] - np.asarray(reference, dtype=np.float64)[:, None, :]
    return (diff > 0).astype(np.float64) + 0.5 * (diff == 0)


def win_scores(policy: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """Per-prompt win score ``w[i]`` (mean over the prompt's pairs). [P, n], [P, m] -> [P]."""
    return pair_outcomes(policy, reference).mean(axis=(1, 2))


def rule_agreement(policy: np.ndarray, reference: np.ndarray, policy_correct: Sequence[Sequence[bool] | None],
                   reference_correct: Sequence[Sequence[bool] | None]) -> tuple[float | None, int]:
    """(agreement, number of decisive pairs): over every (policy sample, reference sample) pair of a
    prompt where exactly one of the two is right, the mean outcome (1 / 0.5 / 0) of the right one by
    the scores (module docstring). Prompts without a ground truth (None) are left out; no decisive
    pair gives (None, 0). policy [P, n], reference [P, m]; the marks are [P][n] and [P][m]."""
    total, count = 0.0, 0
    outcomes = pair_outcomes(policy, reference)  # [P, n, m]: 1 when the policy's sample scores higher
    for i, (mine, theirs) in enumerate(zip(policy_correct, reference_correct)):
        if mine is None or theirs is None:
            continue
        right_p = np.asarray(mine, dtype=bool)[:, None]
        right_r = np.asarray(theirs, dtype=bool)[None, :]
        # Only the policy right: its win counts; only the reference right: the reference's (1 - outcome).
        total += float(outcomes[i][right_p & ~right_r].sum() + (1.0 - outcomes[i][~right_p & right_r]).sum())
        count += int((right_p != right_r).sum())
    return (total / count if count else None), count


def bootstrap_ci(values: np.ndarray, *, num_resamples: int, seed: int,
                 level: float = 0.95) -> tuple[float, float]:
    """Percentile-bootstrap interval of ``mean(values)``, resampling the entries of ``values``.

    values [P] (one entry per prompt). Deterministic for a given seed."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 1 or values.size == 0:
        raise ValueError(f"bootstrap_ci needs a non-empty 1-D array, got shape {values.shape}")
    if num_resamples < 1:
        raise ValueError(f"num_resamples must be >= 1, got {num_resamples}")
    rng = np.random.default_rng(seed)
    means = np.empty(num_resamples, dtype=np.float64)
    for start in range(0, num_resamples, _BOOTSTRAP_CHUNK):
        stop = min(start + _BOOTSTRAP_CHUNK, num_resamples)
        idx = rng.integers(0, values.size, size=(stop - start, values.size))
        means[start:stop] = values[idx].mean(axis=1)
    alpha = (1.0 - level) / 2.0
    low, high = np.quantile(means, [alpha, 1.0 - alpha])
    return float(low), float(high)


@dataclass(frozen=True)
class LengthControlFit:
    """Logistic fit ``P(win) = sigmoid(intercept + slope * diff / scale)``; ``win_rate`` = sigmoid(intercept)."""

    win_rate: float
    intercept: float
    slope: float
    scale: float
    iterations: int


def _sigmoid(z: np.ndarray) -> np.ndarray:
    return 0.5 * (1.0 + np.tanh(0.5 * z))  # no overflow for large |z|


def length_controlled_win_rate(outcomes: np.ndarray, length_diff: np.ndarray, *, ridge: float = 1e-6,
                               max_iter: int = 100, tol: float = 1e-10) -> LengthControlFit:
    """Fit the logistic regression of the module docstring by Newton's method.

    outcomes [N] in [0, 1] (1 win, 0.5 tie, 0 loss), length_diff [N] (policy minus reference).
    The objective is the mean log-loss plus ``ridge / 2 * slope**2``; the intercept is not
    penalised, so it is the maximum-likelihood value given the slope."""
    y = np.asarray(outcomes, dtype=np.float64).ravel()
    d = np.asarray(length_diff, dtype=np.float64).ravel()
    if y.shape != d.shape or y.size == 0:
        raise ValueError(f"outcomes and length_diff must be non-empty and equally long, got {y.shape}, {d.shape}")
    if np.all(y == y[0]):  # all wins / all losses / all ties: the MLE is that constant, at any slope
        return LengthControlFit(float(y[0]), math.inf if y[0] == 1 else -math.inf if y[0] == 0 else 0.0, 0.0, 1.0, 0)
    scale = float(d.std()) or 1.0
    x = np.stack([np.ones_like(d), d / scale], axis=1)  # [N, 2]
    theta = np.zeros(2)
    penalty = np.diag([0.0, ridge])
    for it in range(1, max_iter + 1):
        p = _sigmoid(x @ theta)
        grad = x.T @ (p - y) / y.size + penalty @ theta
        hess = (x * (p * (1 - p))[:, None]).T @ x / y.size + penalty
        step = np.linalg.solve(hess + 1e-12 * np.eye(2), grad)
        theta -= step
        if np.max(np.abs(step)) < tol:
            break
    return LengthControlFit(float(_sigmoid(theta[:1])[0]), float(theta[0]), float(theta[1]), scale, it)


# ---------------------------------------------------------------------------------- rewards


def quantiles(values: Sequence[float] | np.ndarray, qs: Sequence[float] = QUANTILES) -> dict[str, float]:
    """``{"p10": ..., "p50": ...}`` (linear interpolation, numpy's default)."""
    arr = np.asarray(values, dtype=np.float64).ravel()
    if arr.size == 0:
        return {}
    return {f"p{round(q * 100)}": float(v) for q, v in zip(qs, np.quantile(arr, list(qs)))}


# --------------------------------------------------------------------------------- accuracy


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from ``c`` correct out of ``n`` samples (Chen et al. 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset contains a correct sample
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


def majority_index(answers: Sequence[Hashable | None]) -> int | None:
    """Index of the first sample holding the most frequent answer (ties: the answer seen first);
    None when no sample has an answer (None = no answer, does not vote)."""
    counts: dict[Hashable, int] = {}
    first: dict[Hashable, int] = {}
    for j, answer in enumerate(answers):
        if answer is None:
            continue
        counts[answer] = counts.get(answer, 0) + 1
        first.setdefault(answer, j)
    if not counts:
        return None
    best = max(counts, key=lambda a: (counts[a], -first[a]))
    return first[best]


def majority_correct(answers: Sequence[Hashable | None], correct: Sequence[bool]) -> bool:
    """True when the most frequent answer (ties: first seen) is a correct one.

    answers[j] is sample j's answer key (equal keys = answers the scorer calls equal; None = no
    answer, does not vote); correct[j] is its rule score. Equal answers have equal correctness, so
    the first sample holding the winning answer speaks for it."""
    j = majority_index(answers)
    return j is not None and bool(correct[j])


def k_values(n: int) -> list[int]:
    """The k reported for ``n`` samples: 1, the powers of two below n, and n."""
    ks = {1, n}
    k = 2
    while k < n:
        ks.add(k)
        k *= 2
    return sorted(ks)


def accuracy_table(correct: Sequence[Sequence[bool]], answers: Sequence[Sequence[Hashable | None]]) -> dict[str, float]:
    """pass@k for each reported k and maj@n (when n > 1), averaged over prompts.

    correct[i][j] / answers[i][j]: sample j of prompt i; every prompt has the same n."""
    if not correct:
        return {}
    n = len(correct[0])
    out: dict[str, float] = {}
    counts = [sum(bool(c) for c in row) for row in correct]
    for k in k_values(n):
        out[f"pass@{k}"] = float(np.mean([pass_at_k(n, c, k) for c in counts]))
    if n > 1:
        out[f"maj@{n}"] = float(np.mean([majority_correct(a, c) for a, c in zip(answers, correct)]))
    out["num_prompts"] = float(len(correct))
    return out
