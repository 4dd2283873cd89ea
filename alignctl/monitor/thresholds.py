"""The monitor's settings and the shape of its history: a leaf that both rule modules (alarms.py,
engine_rules.py) import, so neither has to import the other for its types."""

from __future__ import annotations

from dataclasses import dataclass

Series = list[tuple[int, float]]  # (step, value) of one metric, in step order


@dataclass(frozen=True)
class Thresholds:
    window: int = 4
    gold_drop: float = 0.05
    entropy_floor: float = 0.1
    length_high: float = 1.3
    length_low: float = 0.75
    min_unique: float = 0.25
    kl_budget: float = 0.5
    tool_use_low: float = 0.25
    false_alarm_rate: float = 0.05  # the baseline tests' (evidence.py): chance of a false alarm over a run
    mismatch_kl: float = 0.01  # engine_rules.py: training-inference mismatch KL (k3), nats per token
    prob_ratio: float = 1.05  # engine_rules.py: geometric-mean token probability ratio (NeMo-RL's bound)
    max_staleness: int | None = None  # the asynchronous loop's bound, set by the loop (None: not judged)
