"""The training-health monitor: watches every RL step's metrics and raises alarms (reward
hacking, entropy / length / mode collapse, KL over budget, non-finite numbers; and, in
:mod:`engine_rules`, a rollout engine that disagrees with the trainer or samples staler than the
asynchronous bound) with a policy per alarm: warn, stop (checkpoint, then exit with a one-line
reason), or ignore. See docs/monitor.md.

Given a :class:`Baseline` (the reference policy's numbers, measured once before step 1), the rules
of :mod:`evidence` compare every step with it through sequential tests; without one, the window
rules of :mod:`alarms` compare the run with its own first steps. Apart from the baseline it reads
only metrics the loop already computes (plus :func:`signals.response_diversity`). Pure
bookkeeping: the trainer decides what a ``stop`` does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from alignctl.monitor.alarms import RULES, Series, Thresholds
from alignctl.monitor.baseline import Baseline
from alignctl.monitor.engine_rules import mismatch_summary, staleness_summary
from alignctl.monitor.evidence import BaselineRules, Settings
from alignctl.monitor.signals import response_diversity


@dataclass(frozen=True)
class Alarm:
    name: str
    step: int
    reason: str
    policy: str  # warn | stop

    def line(self) -> str:
        return f"step {self.step}: {self.name}: {self.reason}"


@dataclass
class Monitor:
    """Feed it each step's metrics with :meth:`observe`; it returns the alarms that start now.

    An alarm fires once when its condition starts and again only after the condition cleared."""

    thresholds: Thresholds = field(default_factory=Thresholds)
    policies: dict[str, str] = field(default_factory=dict)  # alarm -> warn | stop | ignore
    default_policy: str = "warn"
    history: dict[str, Series] = field(default_factory=dict)
    active: set[str] = field(default_factory=set)
    baseline_rules: BaselineRules | None = None
    fired: list[Alarm] = field(default_factory=list)  # every alarm of the run, in order

    @classmethod
    def from_config(cls, cfg: Any, *, max_staleness: int | None = None) -> Monitor:
        """The monitor of a ``monitor`` config section; ``max_staleness``: the asynchronous loop's
        bound on a trained sample's policy age (None in the synchronous loop)."""
        names = {f.name for f in fields(Thresholds)} - {"max_staleness"}
        thresholds = Thresholds(**{name: getattr(cfg, name) for name in names}, max_staleness=max_staleness)
        return cls(thresholds, dict(cfg.policies), cfg.policy)

    def set_baseline(self, baseline: Baseline, horizon: int) -> None:
        """Compare from now on with ``baseline``; ``horizon``: the run's steps (false alarms are bounded over them)."""
        t = self.thresholds
        self.baseline_rules = BaselineRules(baseline, Settings(
            false_alarm_rate=t.false_alarm_rate, horizon=horizon, length_high=t.length_high,
            length_low=t.length_low, entropy_floor=t.entropy_floor, min_unique=t.min_unique, window=t.window))

    def record(self, step: int, metrics: dict[str, Any]) -> None:
        for key, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self.history.setdefault(key, []).append((step, float(value)))

    def observe(self, step: int, metrics: dict[str, Any]) -> list[Alarm]:
        self.record(step, metrics)
        judged = self.baseline_rules.update(step, metrics) if self.baseline_rules is not None else {}
        started = []
        for name, rule in RULES.items():
            policy = self.policies.get(name, self.default_policy)
            if policy == "ignore":
                reason = None
            elif name in judged:  # the trend rule stays for slow drifts of a per-step gold
                reason = judged[name] or (rule(self.history, metrics, self.thresholds)
                                          if name == "reward_hacking" else None)
            else:
                reason = rule(self.history, metrics, self.thresholds)
            if reason is None:
                self.active.discard(name)
            elif name not in self.active:
                self.active.add(name)
                started.append(Alarm(name, step, reason, policy))
        self.fired.extend(started)
        return started

    def summary(self) -> dict[str, Any]:
        """What the run's summary should say about it: each alarm's line, and over the run the
        staleness (asynchronous loop) and the largest training-inference mismatch, where logged."""
        out: dict[str, Any] = {"alarms": [a.line() for a in self.fired]}
        staleness = staleness_summary(self.history, self.thresholds.max_staleness)
        if staleness is not None:
            out["staleness"] = staleness
        mismatch = mismatch_summary(self.history)
        if mismatch is not None:
            out["rollout_mismatch"] = mismatch
        return out

    def summary_line(self) -> str | None:
        """One console line on staleness and mismatch for the end of a run (None: nothing to say)."""
        parts = []
        if (st := staleness_summary(self.history, self.thresholds.max_staleness)) is not None:
            bound = "" if st["bound"] is None else f" (bound {st['bound']}, {st['steps_over_bound']} steps over)"
            mean = "-" if st["mean"] is None else f"{st['mean']:.2f}"
            parts.append(f"staleness mean {mean}, max {st['max']:g}{bound}" if st["max"] is not None
                         else f"staleness mean {mean}")
        if (mm := mismatch_summary(self.history)) is not None:
            parts += [f"{label} {mm[key]:.3g}" for key, label in (("k3_kl_max", "largest mismatch KL (k3)"),
                                                                 ("token_prob_ratio_max", "largest token probability ratio"))
                      if key in mm]
        return "monitor: " + ", ".join(parts) if parts else None


ALARM_NAMES = tuple(RULES)

__all__ = ["ALARM_NAMES", "Alarm", "Baseline", "Monitor", "Thresholds", "response_diversity"]
