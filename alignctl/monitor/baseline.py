"""The reference policy's own numbers, measured before step 1: what the sequential tests compare with.

Pure bookkeeping (no torch): :func:`summarize` turns one baseline batch's per-response numbers
into a :class:`Baseline`; :meth:`Baseline.pooled_with` folds in step 1's batch, which the
reference policy also sampled (no update has happened before it). The measuring itself (generate,
score, one log-prob pass) is :func:`alignctl.monitor.measure.measure_baseline`.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from typing import Any

BASELINE_FILE = "monitor_baseline.json"  # in the run folder: a resumed run reads it back
RESPONSES_KEY = "monitor/responses"  # responses in the step's trained batch (signals.response_diversity)


def scored_responses(metrics: dict[str, Any]) -> float | None:
    """How many responses the step's ``reward/*`` means average over: DAPO's dynamic sampling
    pools them over its generation rounds, each as large as the trained batch."""
    responses = metrics.get(RESPONSES_KEY)
    return None if responses is None else float(responses) * float(metrics.get("dapo/num_gen_batches", 1.0))


@dataclass(frozen=True)
class Baseline:
    responses: int  # responses the means below average over
    group_size: int  # responses per prompt (rollout.n)
    prompts: int  # prompt groups of the pre-step batch (the spreads come from them)
    proxy_key: str
    proxy: float
    length: float  # mean response length, tokens
    length_group_sd: float  # spread of one prompt group's mean length (pre-step batch)
    length_responses: int  # responses the length mean averages over (DAPO: the groups it would keep)
    gold_key: str | None = None
    gold: float | None = None  # mean gold (accuracy) in [0, 1]
    gold_inflation: float = 1.0  # design effect: variance of a group's mean gold over the binomial one
    entropy: float | None = None  # token-mean entropy of the sampled responses
    unique: float | None = None  # share of distinct responses
    seconds: float = 0.0  # time the pre-step measurement took
    pooled_step1: bool = False

    def length_sd(self, responses: float) -> float:
        """Standard deviation of the mean length of a batch of ``responses`` responses."""
        return self.length_group_sd / math.sqrt(max(responses / self.group_size, 1.0))

    def gold_se(self) -> float:
        """Standard error of the baseline's own gold mean (with the design effect)."""
        p = self.gold or 0.0
        return math.sqrt(p * (1 - p) * self.gold_inflation / self.responses)

    def length_se(self) -> float:
        return self.length_sd(self.length_responses)

    def pooled_with(self, metrics: dict[str, Any]) -> Baseline:
        """Step 1's means folded in, weighted by their response counts (spreads stay the pre-step ones)."""
        scored, trained = scored_responses(metrics), metrics.get(RESPONSES_KEY)
        if self.pooled_step1 or scored is None or trained is None:
            return self

        def pool(old: float | None, key: str, own: int, new: float) -> float | None:
            value = metrics.get(key)
            if old is None or not isinstance(value, (int, float)) or not math.isfinite(value):
                return old
            return (old * own + float(value) * new) / (own + new)

        gold = pool(self.gold, self.gold_key, self.responses, scored) if self.gold_key else None
        return replace(self, proxy=pool(self.proxy, self.proxy_key, self.responses, scored),
                       gold=gold, responses=self.responses + int(scored),
                       length=pool(self.length, "response_length/mean", self.length_responses, float(trained)),
                       length_responses=self.length_responses + int(trained), pooled_step1=True)

    def line(self) -> str:
        """One console line: what the reference policy did before step 1."""
        parts = [f"{self.prompts} prompts x {self.group_size}", f"length {self.length:.1f}"]
        if self.gold is not None:
            parts.append(f"{self.gold_key} {self.gold:.3f} (design effect {self.gold_inflation:.2f})")
        parts.append(f"{self.proxy_key} {self.proxy:.3f}")
        if self.entropy is not None:
            parts.append(f"entropy {self.entropy:.3f}")
        if self.unique is not None:
            parts.append(f"distinct {self.unique:.0%}")
        return ", ".join(parts) + f" ({self.seconds:.1f} s)"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_dict(data: dict[str, Any]) -> Baseline:
        return Baseline(**data)


def _sd(values: list[float]) -> float:
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1))


def gold_inflation(group_means: list[float], group_size: int) -> float:
    """Design effect of a group-structured accuracy: the variance of the groups' means over what
    independent responses would give, p(1-p)/n; at least 1 (a smaller estimate is noise)."""
    p = sum(group_means) / len(group_means)
    if not 0 < p < 1 or len(group_means) < 2:
        return 1.0
    return max(1.0, _sd(group_means) ** 2 * group_size / (p * (1 - p)))


def summarize(group_index: list[int], lengths: list[float], scores: list[float], *, proxy_key: str,
              proxy: float | None = None, gold_key: str | None = None, gold_by_group: dict[int, float] | None = None,
              entropy: float | None = None, unique: float | None = None, informative_only: bool = False,
              seconds: float = 0.0) -> Baseline:
    """A baseline from one batch: per response its group id, length and score; per group its mean
    gold. The proxy is the scores' mean unless given (a reward model's mean score). ``informative_only`` (DAPO's dynamic sampling trains only on groups whose scores
    differ): the length numbers come from those groups, as the trained batch's do."""
    members: dict[int, list[int]] = defaultdict(list)
    for row, gid in enumerate(group_index):
        members[gid].append(row)
    group_size = max(len(rows) for rows in members.values())
    kept = [rows for rows in members.values()
            if not informative_only or len({scores[r] for r in rows}) > 1] or list(members.values())
    length_means = [sum(lengths[r] for r in rows) / len(rows) for rows in kept]
    gold = gold_groups = None
    if gold_key is not None and gold_by_group:
        gold_groups = [gold_by_group[g] for g in members]
        gold = sum(gold_groups) / len(gold_groups)
    return Baseline(responses=len(group_index), group_size=group_size, prompts=len(members), proxy_key=proxy_key,
                    proxy=sum(scores) / len(scores) if proxy is None else proxy, length=sum(length_means) / len(length_means),
                    length_group_sd=_sd(length_means), length_responses=sum(len(rows) for rows in kept),
                    gold_key=gold_key if gold is not None else None, gold=gold,
                    gold_inflation=gold_inflation(gold_groups, group_size) if gold_groups else 1.0,
                    entropy=entropy, unique=unique, seconds=seconds)
