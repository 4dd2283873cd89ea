"""Training-health alarms: pure rules over the history of logged metrics.

Notation: W is ``monitor.window``. For a signal x logged at steps 1..n,
``start(x)`` is the mean of its first W values (frozen once W values exist) and ``recent(x)`` the
mean of its last W values; a rule is only evaluated once 2W values exist, so the two never
overlap. Each rule returns a one-line reason, or None.

| alarm            | fires when (defaults)                                                        |
|------------------|------------------------------------------------------------------------------|
| non_finite       | any logged number is NaN or inf                                               |
| reward_hacking   | recent(proxy) > start(proxy) while the gold signal fell: start - recent of    |
|                  | the rule score >= max(gold_drop (0.05), 3 standard errors; noise from         |
|                  | step-to-step differences), or the latest                                      |
|                  | validation accuracy >= gold_drop below the first one                          |
| entropy_collapse | recent(actor/entropy) < entropy_floor (0.1) x start(actor/entropy)            |
| length_blowup    | recent(response_length/mean) > length_high (2.0) x start                      |
| length_collapse  | recent(response_length/mean) < length_low (0.5) x start                       |
| mode_collapse    | recent(monitor/unique_in_batch) < min_unique (0.25)                           |
| kl_budget        | recent(actor/reference_kl, else actor/kl_loss) > kl_budget (0.5 nats/token)   |

The proxy is what the policy optimises (the reward model's score when one is used, else the
total score); the gold signal is the rule score when a reward model is also used, else the
accuracy a custom reward function reports beside its score (``{"score": ..., "acc": ...}``, logged
as ``reward/extra/acc/mean``), else the validation accuracy (``val-core/*/acc/*``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

Series = list[tuple[int, float]]
NOISE_Z = 3.0  # a per-step gold fall must exceed this many standard errors (see _gold_fall)


@dataclass(frozen=True)
class Thresholds:
    window: int = 4
    gold_drop: float = 0.05
    entropy_floor: float = 0.1
    length_high: float = 2.0
    length_low: float = 0.5
    min_unique: float = 0.25
    kl_budget: float = 0.5


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _start_recent(series: Series, window: int) -> tuple[float, float] | None:
    values = [v for _, v in series]
    if len(values) < 2 * window:
        return None
    return _mean(values[:window]), _mean(values[-window:])


def _recent(series: Series, window: int) -> float | None:
    values = [v for _, v in series]
    return _mean(values[-window:]) if len(values) >= window else None


def non_finite(history: dict[str, Series], latest: dict[str, Any], t: Thresholds) -> str | None:
    bad = sorted(k for k, v in latest.items() if isinstance(v, float) and not math.isfinite(v))
    return f"{', '.join(bad[:3])} not finite" if bad else None


def _noise_sd(values: list[float]) -> float:
    """Step-to-step noise of a series, blind to slow trends (von Neumann): sqrt(mean(diff^2) / 2)."""
    diffs = [b - a for a, b in zip(values, values[1:])]
    return math.sqrt(sum(d * d for d in diffs) / (2 * len(diffs))) if diffs else 0.0


def _gold_fall(history: dict[str, Series], t: Thresholds) -> str | None:
    """How the gold signal fell since the start, or None when it did not (or there is none).

    One batch's rule score is a noisy accuracy: a fall of the W-mean counts only when it is at
    least ``gold_drop`` and at least ``NOISE_Z`` standard errors of a difference of two W-means."""
    per_step = _per_step_gold(history)
    if per_step is not None:
        name, series = per_step
        if len(series) < 2 * t.window:
            return None
        values = [v for _, v in series]
        start, recent = _mean(values[:t.window]), _mean(values[-t.window:])
        needed = max(t.gold_drop, NOISE_Z * _noise_sd(values) * math.sqrt(2 / t.window))
        if start - recent >= needed:
            return f"{name} {start:.3f} -> {recent:.3f} (a fall > {needed:.3f} counts)"
        return None
    for key, series in history.items():
        if key.startswith("val-core/") and "/acc/" in key and len(series) >= 2:
            first, last = series[0][1], series[-1][1]
            if first - last >= t.gold_drop:
                return f"{key} {first:.3f} -> {last:.3f}"
    return None


def _per_step_gold(history: dict[str, Series]) -> tuple[str, Series] | None:
    """A gold signal measured on every training batch: the rule score beside a reward model, or
    the accuracy a custom reward reports beside its score."""
    if "reward/rm_score/mean" in history and "reward/rule_score/mean" in history:
        return "rule score", history["reward/rule_score/mean"]
    if "reward/extra/acc/mean" in history:
        return "reward's acc", history["reward/extra/acc/mean"]
    return None


def reward_hacking(history: dict[str, Series], latest: dict[str, Any], t: Thresholds) -> str | None:
    proxy_key = "reward/rm_score/mean" if "reward/rm_score/mean" in history else "critic/score/mean"
    proxy = _start_recent(history.get(proxy_key, []), t.window)
    if proxy is None or proxy[1] <= proxy[0]:
        return None
    fall = _gold_fall(history, t)
    return f"{proxy_key} up {proxy[0]:.3f} -> {proxy[1]:.3f} while {fall}" if fall else None


def _ratio_rule(key: str, below: Callable[[Thresholds], float] | None, above: Callable[[Thresholds], float] | None,
                what: str) -> Callable[[dict[str, Series], dict[str, Any], Thresholds], str | None]:
    def rule(history: dict[str, Series], latest: dict[str, Any], t: Thresholds) -> str | None:
        pair = _start_recent(history.get(key, []), t.window)
        if pair is None or pair[0] <= 0:
            return None
        start, recent = pair
        if below is not None and recent < below(t) * start:
            return f"{key} {start:.3g} -> {recent:.3g} (< {below(t):g} x start): {what}"
        if above is not None and recent > above(t) * start:
            return f"{key} {start:.3g} -> {recent:.3g} (> {above(t):g} x start): {what}"
        return None
    return rule


def mode_collapse(history: dict[str, Series], latest: dict[str, Any], t: Thresholds) -> str | None:
    recent = _recent(history.get("monitor/unique_in_batch", []), t.window)
    if recent is None or recent >= t.min_unique:
        return None
    return f"only {recent:.0%} of the batch's responses are distinct (< {t.min_unique:.0%}): the policy gives one answer to everything"


KL_KEYS = ("actor/reference_kl", "actor/kl_loss")  # measured KL (k1) when logged, else the KL-loss estimate


def kl_budget(history: dict[str, Series], latest: dict[str, Any], t: Thresholds) -> str | None:
    key = next((k for k in KL_KEYS if k in history), None)
    recent = _recent(history.get(key, []), t.window) if key else None
    if recent is None or recent <= t.kl_budget:
        return None
    return f"{key} {recent:.3g} > budget {t.kl_budget:g} nats/token"


RULES: dict[str, Callable[[dict[str, Series], dict[str, Any], Thresholds], str | None]] = {
    "non_finite": non_finite,
    "reward_hacking": reward_hacking,
    "entropy_collapse": _ratio_rule("actor/entropy", lambda t: t.entropy_floor, None, "entropy collapsed"),
    "length_blowup": _ratio_rule("response_length/mean", None, lambda t: t.length_high, "responses grew"),
    "length_collapse": _ratio_rule("response_length/mean", lambda t: t.length_low, None, "responses shrank"),
    "mode_collapse": mode_collapse,
    "kl_budget": kl_budget,
}
