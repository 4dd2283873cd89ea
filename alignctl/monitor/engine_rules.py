"""Alarms on the machinery rather than the policy: the rollout engine's probabilities drifting from
the trainer's (the training-inference mismatch) and samples older than the asynchronous loop's
staleness bound. Either is a framework problem (a bad weight sync, a dtype or temperature the two
sides disagree on, a queue that lets old samples through), not something training will fix.

Each rule reads the latest step's metrics (one batch's mean over thousands of tokens is already a
steady number, and a broken engine should be named at the step it breaks):

| alarm              | fires when (defaults)                                                       |
|--------------------|-----------------------------------------------------------------------------|
| mismatch_kl        | rollout_corr/k3_kl > mismatch_kl (0.01 nats per token)                      |
| token_prob_ratio   | exp(rollout/log_prob_diff_mean) > prob_ratio (1.05)                          |
| staleness_bound    | rollout/staleness/max > the loop's max_staleness (when the loop sets one)    |

The mismatch metrics are logged only when the old log-probs are recomputed (not on the on-policy
shortcut, and not with ``actor.recompute_old_log_prob=false``); without them these rules are silent.
In the asynchronous loop a stale response's gap also holds the policy's own change since it was
sampled, so both rules judge the step's fresh responses (``rollout/fresh/*``, sampled by the weights
being trained) and pass over a step that has none.
``exp(mean |log p_trainer - log p_engine|)`` is the geometric mean over response tokens of the
token's probability ratio taken the larger way round, max(p/q, q/p): 1 for engines that agree. It is
never above the arithmetic mean NeMo-RL calls ``token_mult_prob_error`` (Jensen), so it fires only
where that one would too.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from alignctl.monitor.thresholds import Series, Thresholds

K3_KEY, K1_KEY = "rollout_corr/k3_kl", "rollout_corr/kl"
ABS_DIFF_KEY, MAX_DIFF_KEY = "rollout/log_prob_diff_mean", "rollout/log_prob_diff_max"
STALENESS_MEAN_KEY, STALENESS_MAX_KEY = "rollout/staleness/mean", "rollout/staleness/max"
FRESH_SHARE_KEY = "rollout/fresh/share"


def _fresh(key: str) -> str:
    """The key of the same measure over the fresh responses only (metrics.rollout_mismatch_metrics)."""
    group, name = key.split("/", 1)
    return f"{group}/fresh/{name}"


def engine_gap(latest: dict[str, Any], key: str) -> tuple[str, str] | None:
    """Which key measures the engine's own gap this step, and a note for the evidence line: ``key``
    when every response is fresh (or the loop is synchronous), its fresh twin when some are stale,
    None when none is fresh (nothing to judge)."""
    share = _latest(latest, FRESH_SHARE_KEY)
    if share is None or share >= 1.0:
        return key, ""
    if share <= 0.0 or _latest(latest, _fresh(key)) is None:
        return None
    return _fresh(key), f" (the step's fresh responses, {share:.0%} of it; stale ones also hold the policy's own change)"


def _latest(latest: dict[str, Any], key: str) -> float | None:
    value = latest.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _before(history: dict[str, Series], key: str, transform: Any = float) -> str:
    """The signal's largest value before this step, for the evidence line ('' at the first step)."""
    earlier = history.get(key, [])[:-1]
    if not earlier:
        return ""
    return f"; at most {max(transform(v) for _, v in earlier):.3g} over steps {earlier[0][0]}-{earlier[-1][0]}"


def mismatch_kl(history: dict[str, Series], latest: dict[str, Any], t: Thresholds) -> str | None:
    picked = engine_gap(latest, K3_KEY)
    k3 = None if picked is None else _latest(latest, picked[0])
    if picked is None or k3 is None or k3 <= t.mismatch_kl:
        return None
    key, note = picked
    k1 = _latest(latest, K1_KEY if key == K3_KEY else _fresh(K1_KEY))
    k1_text = "" if k1 is None else f", k1 {k1:.3g}"
    return (f"{key} {k3:.3g} > bound {t.mismatch_kl:g} nats/token{k1_text}{_before(history, key)}{note}: the "
            f"rollout engine's probabilities are not the trainer's")


def token_prob_ratio(history: dict[str, Series], latest: dict[str, Any], t: Thresholds) -> str | None:
    picked = engine_gap(latest, ABS_DIFF_KEY)
    diff = None if picked is None else _latest(latest, picked[0])
    if picked is None or diff is None or math.exp(diff) <= t.prob_ratio:
        return None
    key, note = picked
    worst = _latest(latest, MAX_DIFF_KEY if key == ABS_DIFF_KEY else _fresh(MAX_DIFF_KEY))
    worst_text = "" if worst is None else f", worst token {math.exp(min(worst, 50.0)):.3g}x"
    return (f"token probability ratio exp({key}) {math.exp(diff):.4g} > bound {t.prob_ratio:g}{worst_text}"
            f"{_before(history, key, math.exp)}{note}: the rollout engine and the trainer disagree on the "
            f"sampled tokens")


def staleness_bound(history: dict[str, Series], latest: dict[str, Any], t: Thresholds) -> str | None:
    worst = _latest(latest, STALENESS_MAX_KEY)
    if t.max_staleness is None or worst is None or worst <= t.max_staleness:
        return None
    mean = _latest(latest, STALENESS_MEAN_KEY)
    mean_text = "" if mean is None else f" (mean {mean:.2f})"
    return (f"{STALENESS_MAX_KEY} {worst:g}{mean_text} > max_staleness {t.max_staleness}: a trained sample came "
            f"from a policy older than the bound allows (a bug in the asynchronous loop)")


def staleness_summary(history: dict[str, Series], bound: int | None) -> dict[str, float | int | None] | None:
    """Over the run: the mean of the per-step mean staleness, the largest staleness, the steps over
    the bound; None when the run logged no staleness (the synchronous loop)."""
    means, maxima = history.get(STALENESS_MEAN_KEY, []), history.get(STALENESS_MAX_KEY, [])
    if not means and not maxima:
        return None
    return {"mean": sum(v for _, v in means) / len(means) if means else None,
            "max": max(v for _, v in maxima) if maxima else None, "bound": bound,
            "steps_over_bound": sum(v > bound for _, v in maxima) if bound is not None else None}


def _engine_series(history: dict[str, Series], key: str) -> list[float]:
    """Per step, the engine's own gap: the fresh responses' where a step logged them, else the whole
    step's when all of it was fresh (or the loop synchronous); steps with only stale responses drop out."""
    fresh = dict(history.get(_fresh(key), []))
    share = dict(history.get(FRESH_SHARE_KEY, []))
    return [fresh[step] if step in fresh else value for step, value in history.get(key, [])
            if step in fresh or share.get(step, 1.0) >= 1.0]


def mismatch_summary(history: dict[str, Series]) -> dict[str, float] | None:
    """Over the run: the largest mismatch KL (k3) and token probability ratio of the engine's own gap
    (the fresh responses' in an asynchronous run); None without them."""
    out = {}
    if k3 := _engine_series(history, K3_KEY):
        out["k3_kl_max"] = max(k3)
    if diffs := _engine_series(history, ABS_DIFF_KEY):
        out["token_prob_ratio_max"] = math.exp(max(diffs))
    return out or None
