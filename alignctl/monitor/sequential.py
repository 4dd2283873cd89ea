"""One-sided CUSUM tests for the monitor: pure math, no config, no torch.

A CUSUM adds each step's log-likelihood ratio (evidence for "changed" against "as at the
baseline") and floors the sum at 0: S_t = max(0, S_{t-1} + llr_t). It fires when S_t >= h.

False alarms. Under the baseline, exp(sum of llr from any start step) is a non-negative
martingale with mean 1, so by Ville's inequality it ever reaches e^h with probability at most
e^-h. The CUSUM fires within T steps only if one of its T start steps does: at most T e^-h.
``threshold(rate, T) = ln(T / rate)`` keeps that bound at ``rate``.

Delay (Wald's approximation, overshoot ignored): after a change the statistic climbs by
``drift`` = E[llr_t] per step, so it fires about ``h / drift`` steps after the change
(:func:`expected_delay`); see docs/monitor.md for the drift of each test.

The change most likely began at the step after the statistic last stood at 0: the start of the
run of steps whose evidence it is summing (:attr:`Cusum.began`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def threshold(false_alarm_rate: float, horizon: int) -> float:
    """h such that a CUSUM watching ``horizon`` steps fires falsely with chance <= the rate."""
    return math.log(max(horizon, 1) / false_alarm_rate)


def scaled_odds(p: float, factor: float) -> float:
    """The rate whose odds are ``factor`` x those of ``p`` (0.19, 1/2 -> 0.105; 0.19, 1/4 -> 0.055)."""
    odds = p / (1 - p) * factor
    return odds / (1 + odds)


def halved_odds(p: float) -> float:
    """The rate whose odds are half those of ``p`` (0.19 -> 0.105)."""
    return scaled_odds(p, 0.5)


def bernoulli_llr(mean: float, count: float, p0: float, p1: float, inflation: float = 1.0) -> float:
    """Log-likelihood ratio of ``count`` outcomes in [0, 1] with this ``mean``, rate p1 against p0.

    ``inflation`` (>= 1) divides it: outcomes that come in correlated groups (one prompt's n
    responses) carry less evidence than as many independent ones (the design effect)."""
    per_success, per_failure = math.log(p1 / p0), math.log((1 - p1) / (1 - p0))
    return count * (mean * per_success + (1 - mean) * per_failure) / inflation


def gaussian_llr(mean: float, mu0: float, mu1: float, sd: float) -> float:
    """Log-likelihood ratio of an observed batch mean, N(mu1, sd^2) against N(mu0, sd^2)."""
    return (mu1 - mu0) / sd ** 2 * (mean - (mu0 + mu1) / 2)


def bernoulli_drift(p: float, p0: float, p1: float) -> float:
    """Expected llr per outcome when the true rate is p (negative at p0, positive at p1)."""
    return p * math.log(p1 / p0) + (1 - p) * math.log((1 - p1) / (1 - p0))


def expected_delay(h: float, drift_per_step: float) -> float:
    """Wald's approximation of the steps a CUSUM needs after a change: h / drift (inf if drift <= 0)."""
    return h / drift_per_step if drift_per_step > 0 else math.inf


@dataclass
class Cusum:
    h: float
    statistic: float = 0.0
    began: int | None = None  # first step of the evidence now summed: the likeliest change point

    def update(self, step: int, llr: float) -> bool:
        """Add one step's evidence; True when the statistic reaches h."""
        self.statistic = max(0.0, self.statistic + llr)
        if self.statistic == 0.0:
            self.began = None
        elif self.began is None:
            self.began = step
        return self.statistic >= self.h


def zero_drift_rate(p0: float, p1: float) -> float:
    """The true rate at which a Bernoulli CUSUM of p1 against p0 gathers no evidence either way."""
    per_success, per_failure = math.log(p1 / p0), math.log((1 - p1) / (1 - p0))
    return per_failure / (per_failure - per_success)

