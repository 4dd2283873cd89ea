"""The rules that compare every step with the baseline (the reference policy before step 1).

Each test is a one-sided CUSUM (:mod:`alignctl.monitor.sequential`) that weighs one batch's
evidence by its size and noise, so it fires as soon as the evidence is there:

- ``reward_hacking``: the gold accuracy falls (two Bernoulli CUSUMs, tuned for the odds of a right
  answer halving and quartering; outcomes in [0, 1], per response, divided by the baseline's design
  effect) while the proxy reward stands above its baseline;
- ``length_blowup`` / ``length_collapse``: the mean response length (Gaussian CUSUM, the batch mean
  standardised by the baseline's spread of a prompt group's mean length);
- ``entropy_collapse`` and ``mode_collapse``: the recent W-mean against the baseline's value.

Each CUSUM's threshold is h = ln(T / false_alarm_rate) over the run's T steps: with the baseline's
value known exactly, that bounds the chance of a false alarm by the rate. The baseline is a sample
too, so its value is first moved one standard error toward the change the test looks for.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from alignctl.monitor.alarms import GOLD_NAMES
from alignctl.monitor.baseline import RESPONSES_KEY, Baseline, scored_responses
from alignctl.monitor.sequential import Cusum, bernoulli_llr, gaussian_llr, scaled_odds, threshold

# The baseline's own noise: its value is moved one standard error toward the change before testing.
# In simulated healthy runs that kept false alarms within the configured rate (the tests check it),
# where no move gave about three times the rate and two standard errors about doubled the delay.
MARGIN_SE = 1.0
# The falls the accuracy test watches for, as a factor on the odds of a right answer: halving sees a
# moderate fall soonest, quartering a collapse (an exploit taking hold gathers ~1.5x the evidence a step).
# Two tests share the false-alarm budget: each gets h + ln 2.
GOLD_ODDS_FALLS = (0.5, 0.25)


@dataclass
class Settings:
    false_alarm_rate: float
    horizon: int  # the run's steps
    length_high: float
    length_low: float
    entropy_floor: float
    min_unique: float
    window: int


@dataclass
class Trail:
    """(step, mean, count) of every tested step, to say what the level was since a change began."""

    rows: list[tuple[int, float, float]] = field(default_factory=list)

    def since(self, step: int) -> tuple[float, float]:
        picked = [(m, n) for s, m, n in self.rows if s >= step]
        count = sum(n for _, n in picked)
        return sum(m * n for m, n in picked) / count, count


def _number(metrics: dict[str, Any], key: str | None) -> float | None:
    value = metrics.get(key) if key else None
    return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None


class GoldTest:
    """The gold accuracy fell from the baseline's rate: one CUSUM per fall of GOLD_ODDS_FALLS; the
    first that reaches its threshold fires."""

    def __init__(self, baseline: Baseline, s: Settings) -> None:
        assert baseline.gold is not None
        self.baseline, self.s = baseline, s
        self.h = threshold(s.false_alarm_rate, s.horizon) + math.log(len(GOLD_ODDS_FALLS))
        # The baseline's rate is itself a sample: test against a rate MARGIN_SE standard errors lower.
        self.p0 = baseline.gold - MARGIN_SE * baseline.gold_se()
        self.p1s = [scaled_odds(self.p0, f) for f in GOLD_ODDS_FALLS] if 0 < self.p0 < 1 else []
        self.cusums, self.trail = [Cusum(self.h) for _ in self.p1s], Trail()

    def update(self, step: int, metrics: dict[str, Any]) -> str | None:
        gold, count = _number(metrics, self.baseline.gold_key), scored_responses(metrics)
        proxy = _number(metrics, self.baseline.proxy_key)
        if not self.p1s or gold is None or count is None or not 0 <= gold <= 1:
            return None
        self.trail.rows.append((step, gold, count))
        fired = [cusum.update(step, bernoulli_llr(gold, count, self.p0, p1, self.baseline.gold_inflation))
                 for cusum, p1 in zip(self.cusums, self.p1s)]
        if not any(fired) or proxy is None or proxy <= self.baseline.proxy:
            return None
        cusum, p1 = max(zip(self.cusums, self.p1s), key=lambda pair: pair[0].statistic)  # the test that fired (or the further past h)
        began = cusum.began or step
        now, responses = self.trail.since(began)
        b = self.baseline
        return (f"{GOLD_NAMES.get(b.gold_key or '', b.gold_key)} {b.gold:.3f} at baseline ({b.responses} responses) -> "
                f"{now:.3f} over steps {began}-{step} ({responses:.0f}) while {b.proxy_key} {b.proxy:.3f} -> "
                f"{proxy:.3f}; CUSUM {cusum.statistic:.1f} >= {self.h:.1f} (tested against {self.p0:.3f} vs "
                f"{p1:.3f}); change began at step {began}")


class LengthTest:
    """The mean response length moved past ``factor`` x baseline: a CUSUM whose evidence turns
    positive at that multiple (its alternative sits as far beyond it as the baseline is before)."""

    def __init__(self, baseline: Baseline, s: Settings, factor: float) -> None:
        self.baseline, self.factor, self.up = baseline, factor, factor > 1
        self.h = threshold(s.false_alarm_rate, s.horizon)
        margin = MARGIN_SE * baseline.length_se()
        self.mu0 = baseline.length + margin if self.up else baseline.length - margin
        self.mu1 = (2 * factor - 1) * self.mu0
        self.cusum, self.trail = Cusum(self.h), Trail()

    def update(self, step: int, metrics: dict[str, Any]) -> str | None:
        length, count = _number(metrics, "response_length/mean"), _number(metrics, RESPONSES_KEY)
        if length is None or count is None or self.baseline.length_group_sd <= 0 or self.mu0 <= 0:
            return None
        self.trail.rows.append((step, length, count))
        sd = self.baseline.length_sd(count)
        if not self.cusum.update(step, gaussian_llr(length, self.mu0, self.mu1, sd)):
            return None
        began = self.cusum.began or step
        now, _ = self.trail.since(began)
        side = "above" if self.up else "below"
        return (f"response_length/mean {self.baseline.length:.1f} at baseline -> {now:.1f} over steps {began}-{step} "
                f"({now / self.baseline.length:.2f}x, evidence it is {side} {self.factor:g}x); CUSUM "
                f"{self.cusum.statistic:.1f} >= {self.h:.1f}; change began at step {began}")


def _recent(values: list[float], window: int) -> float | None:
    return sum(values[-window:]) / window if len(values) >= window else None


class BaselineRules:
    """Every baseline rule, fed one step at a time; ``update`` returns a reason (or None) for each
    alarm it judges. Step 1's batch joins the baseline (the reference policy sampled it too)."""

    JUDGES = ("reward_hacking", "length_blowup", "length_collapse", "entropy_collapse", "mode_collapse")

    def __init__(self, baseline: Baseline, settings: Settings) -> None:
        self.baseline, self.s = baseline, settings
        self.tests: dict[str, Any] = {}
        self.entropy: list[float] = []
        self.unique: list[float] = []
        if baseline.pooled_step1:
            self._start_tests()

    def _start_tests(self) -> None:
        b = self.baseline
        self.tests = {}
        if b.length_group_sd > 0:  # lengths that never vary carry no noise scale: the window rules judge them
            self.tests = {"length_blowup": LengthTest(b, self.s, self.s.length_high),
                          "length_collapse": LengthTest(b, self.s, self.s.length_low)}
        if b.gold is not None:
            self.tests["reward_hacking"] = GoldTest(b, self.s)

    def update(self, step: int, metrics: dict[str, Any]) -> dict[str, str | None]:
        if not self.baseline.pooled_step1:
            self.baseline = self.baseline.pooled_with(metrics)
            if self.baseline.pooled_step1:
                self._start_tests()
            reasons: dict[str, str | None] = dict.fromkeys(self.JUDGES)
        else:
            reasons = {name: test.update(step, metrics) for name, test in self.tests.items()}
        reasons["mode_collapse"] = self._unique(metrics)
        entropy = self._entropy(metrics)
        if self.baseline.entropy is not None:
            reasons["entropy_collapse"] = entropy
        return reasons

    def _entropy(self, metrics: dict[str, Any]) -> str | None:
        if (value := _number(metrics, "actor/entropy")) is not None:
            self.entropy.append(value)
        base, recent = self.baseline.entropy, _recent(self.entropy, self.s.window)
        if base is None or base <= 0 or recent is None or recent >= self.s.entropy_floor * base:
            return None
        return (f"actor/entropy {base:.3g} at baseline -> {recent:.3g} over the last {self.s.window} steps "
                f"(< {self.s.entropy_floor:g} x baseline): entropy collapsed")

    def _unique(self, metrics: dict[str, Any]) -> str | None:
        if (value := _number(metrics, "monitor/unique_in_batch")) is not None:
            self.unique.append(value)
        base, recent = self.baseline.unique, _recent(self.unique, self.s.window)
        if recent is None or recent >= self.s.min_unique or (base is not None and base < self.s.min_unique):
            return None  # a reference that already repeats itself has not collapsed in training
        return (f"only {recent:.0%} of the batch's responses are distinct (< {self.s.min_unique:.0%}; baseline "
                f"{'?' if base is None else f'{base:.0%}'}): the policy gives one answer to everything")
