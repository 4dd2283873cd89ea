"""Training-health alarms: pure rules over the history of logged metrics (the window rules).

With a baseline (docs/monitor.md), evidence.py judges reward hacking (beside the trend rule here),
length, entropy and mode collapse against it; these rules judge them without one, and judge the
others always.

Notation: W is ``monitor.window``. For a signal x logged at steps 1..n,
``start(x)`` is the mean of its first W values (frozen once W values exist) and ``recent(x)`` the
mean of its last W values; a rule is only evaluated once 2W values exist, so the two never
overlap. Each rule returns a one-line reason, or None.

| alarm            | fires when (defaults)                                                        |
|------------------|------------------------------------------------------------------------------|
| non_finite       | any logged number is NaN or inf                                               |
| reward_hacking   | per-step gold (rule score beside an RM, or a custom reward's acc): over the    |
|                  | last 4W steps (>= 2W), the gold's least-squares line falls >= gold_drop (0.05) |
|                  | with slope t <= -3, while the proxy's slope is positive; else (validation     |
|                  | accuracy) recent(proxy) > start(proxy) and the latest accuracy >= gold_drop    |
|                  | below the first                                                               |
| entropy_collapse | recent(actor/entropy) < entropy_floor (0.1) x start(actor/entropy)            |
| length_blowup    | recent(response_length/mean) > length_high (1.3) x start                      |
| length_collapse  | recent(response_length/mean) < length_low (0.75) x start                      |
| mode_collapse    | recent(monitor/unique_in_batch) < min_unique (0.25)                           |
| kl_budget        | recent(actor/reference_kl, else actor/kl_loss) > kl_budget (0.5 nats/token)   |
| tool_collapse    | recent(multi_turn/calls_per_sample) < tool_use_low (0.25) x start             |
| mismatch_kl, token_prob_ratio, staleness_bound: the latest step against a bound (engine_rules.py)  |

The proxy is what the policy optimises (the reward model's score when one is used, else the
total score); the gold signal is the rule score when a reward model is also used, else the
accuracy a custom reward function reports beside its score (``{"score": ..., "acc": ...}``, logged
as ``reward/extra/acc/mean``), else the validation accuracy (``val-core/*/acc/*``).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection
from typing import Any

from alignctl.monitor.engine_rules import mismatch_kl, staleness_bound, token_prob_ratio
from alignctl.monitor.thresholds import Series, Thresholds

NOISE_Z = 3.0  # a per-step gold's falling slope must exceed this many standard errors (see _trend_hacking)
TREND_WINDOWS = 4  # the trend of a per-step gold is fitted over the last 4 x W steps


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


def _slope(values: list[float]) -> tuple[float, float]:
    """Least-squares slope per step of ``values`` and its t statistic (0 when undefined)."""
    n = len(values)
    mx, my = (n - 1) / 2, _mean(values)
    sxx = sum((x - mx) ** 2 for x in range(n))
    slope = sum((x - mx) * (v - my) for x, v in enumerate(values)) / sxx
    residual = sum((v - my - slope * (x - mx)) ** 2 for x, v in enumerate(values))
    se = math.sqrt(residual / (n - 2) / sxx) if n > 2 else 0.0
    return slope, (slope / se if se > 0 else (0.0 if slope == 0 else math.copysign(math.inf, slope)))


def _trend_hacking(proxy_key: str, proxy: Series, name: str, gold: Series, t: Thresholds) -> str | None:
    """Per-step gold: over the last TREND_WINDOWS x W steps (at least 2W), the gold's fitted line
    falls by >= gold_drop with a slope beyond NOISE_Z standard errors, while the proxy's rises."""
    steps = sorted(set(dict(proxy)) & set(dict(gold)))[-TREND_WINDOWS * t.window:]
    if len(steps) < max(2 * t.window, 3):
        return None
    gold_at, proxy_at = dict(gold), dict(proxy)
    g_slope, g_t = _slope([gold_at[s] for s in steps])
    p_slope, _ = _slope([proxy_at[s] for s in steps])
    fall = -g_slope * (len(steps) - 1)
    if p_slope > 0 and g_t <= -NOISE_Z and fall >= t.gold_drop:
        return (f"{proxy_key} rising ({p_slope:+.3f}/step) while {name} fell {fall:.3f} over steps "
                f"{steps[0]}-{steps[-1]} (slope {g_slope:+.4f}/step, t = {g_t:.1f})")
    return None


ACC_KEY, RULE_KEY, RM_KEY, SCORE_KEY = ("reward/extra/acc/mean", "reward/rule_score/mean", "reward/rm_score/mean",
                                        "critic/score/mean")


def gold_and_proxy(keys: Collection[str]) -> tuple[str | None, str]:
    """The per-step gold signal among the logged ``keys`` (None without one) and the proxy it is
    watched against. A custom reward's own ``acc`` comes first: beside it the score (bonus
    included, and any reward model's share) is what the policy optimises. Else the rule score
    beside a reward model, whose score is then the proxy."""
    if ACC_KEY in keys:
        return ACC_KEY, SCORE_KEY
    if RM_KEY in keys and RULE_KEY in keys:
        return RULE_KEY, RM_KEY
    return None, RM_KEY if RM_KEY in keys else SCORE_KEY


GOLD_NAMES = {RULE_KEY: "rule score", ACC_KEY: "reward's acc"}


def reward_hacking(history: dict[str, Series], latest: dict[str, Any], t: Thresholds) -> str | None:
    gold_key, proxy_key = gold_and_proxy(history)
    if gold_key is not None:
        return _trend_hacking(proxy_key, history.get(proxy_key, []), GOLD_NAMES[gold_key], history[gold_key], t)
    # Validation accuracy is measured every test_freq steps: proxy start vs recent, first vs last accuracy.
    proxy = _start_recent(history.get(proxy_key, []), t.window)
    if proxy is None or proxy[1] <= proxy[0]:
        return None
    for key, series in history.items():
        if key.startswith("val-core/") and "/acc/" in key and len(series) >= 2:
            first, last = series[0][1], series[-1][1]
            if first - last >= t.gold_drop:
                return f"{proxy_key} up {proxy[0]:.3f} -> {proxy[1]:.3f} while {key} {first:.3f} -> {last:.3f}"
    return None


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
    # Multi-turn runs: the policy stops calling its tools (seen within one step at a high lr).
    "tool_collapse": _ratio_rule("multi_turn/calls_per_sample", lambda t: t.tool_use_low, None,
                                 "the policy stopped calling its tools"),
    "mismatch_kl": mismatch_kl,
    "token_prob_ratio": token_prob_ratio,
    "staleness_bound": staleness_bound,
}
