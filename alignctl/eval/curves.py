"""Training curves of an RL run folder (``metrics.jsonl``, one ``{"step": N, key: value}`` per step).

Panels follow what a person checks first after an RL run: did the reward go up, and did its
distribution move (p10/p50/p90: a p90 racing ahead of the median is the typical sign of reward
hacking)? How far did the policy drift from the reference (KL)? Did entropy collapse? Did
responses grow (a length-hacking reward model)? And did held-out accuracy follow?
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from alignctl.data.readers import read_jsonl
from alignctl.errors import UserError

METRICS_FILE = "metrics.jsonl"

Series = list[tuple[float, float]]  # (step, value)
ALARM_PANEL = "Monitor alarms"


@dataclass(frozen=True)
class Panel:
    title: str
    keys: tuple[str, ...] = ()
    pattern: str | None = None  # a regex picking keys (validation accuracy per data source)
    ylabel: str = ""
    # key -> legend label; keys not named here are shown by their last path parts
    labels: tuple[tuple[str, str], ...] = ()

    def label(self, key: str) -> str:
        return dict(self.labels).get(key) or legend_label(key)


def legend_label(key: str) -> str:
    """A metric key as a legend entry: 'val-core/arith/acc/mean@1' -> 'arith acc mean@1',
    'actor/grad_norm' -> 'actor grad norm'."""
    if key.startswith("val-core/"):
        return key.removeprefix("val-core/").replace("/", " ")
    return key.replace("/", " ").replace("_", " ")


PANELS = (
    Panel("Reward (mean, p10 / p50 / p90)", ("critic/score/mean", "reward/p10", "reward/p50", "reward/p90"),
          ylabel="reward", labels=(("critic/score/mean", "mean reward"), ("reward/p10", "p10"),
                                   ("reward/p50", "median"), ("reward/p90", "p90"))),
    Panel("KL to reference", ("actor/reference_kl", "actor/kl_loss"), ylabel="KL (nats / token)",
          labels=(("actor/reference_kl", "policy vs reference"), ("actor/kl_loss", "KL loss term"))),
    Panel("Entropy", ("actor/entropy",), ylabel="nats / token", labels=(("actor/entropy", "policy entropy"),)),
    Panel("Response length (tokens)", ("response_length/mean",), ylabel="tokens",
          labels=(("response_length/mean", "mean response length"),)),
    Panel("Validation accuracy", pattern=r"^val-core/.+/acc/(mean|best|maj)@\d+$", ylabel="accuracy"),
    # strict rule rewards (gsm8k, arith): the share of answers in the '#### N' form next to the
    # rule score, so a format learned without the right number shows as a gap between the two
    Panel("Answer format and rule score", ("reward/answer_format/mean", "reward/rule_score/mean"),
          ylabel="share of responses", labels=(("reward/answer_format/mean", "in answer format"),
                                               ("reward/rule_score/mean", "rule score"))),
    # PPO's own health: each update's step away from the old policy, the clipped share, gradients,
    # the learning rates; and the critic's fit (a critic that explains nothing gives noise advantages)
    Panel("Policy update (KL old -> new)", ("actor/ppo_kl",), ylabel="KL (nats / token)",
          labels=(("actor/ppo_kl", "KL per update"),)),
    Panel("Clip fraction", ("actor/pg_clipfrac", "critic/vf_clipfrac"), ylabel="share of tokens clipped",
          labels=(("actor/pg_clipfrac", "policy"), ("critic/vf_clipfrac", "value"))),
    Panel("Gradient norm", ("actor/grad_norm", "critic/grad_norm"), ylabel="L2 norm (before clipping)",
          labels=(("actor/grad_norm", "actor"), ("critic/grad_norm", "critic"))),
    Panel("Learning rate", ("actor/lr", "critic/lr"), ylabel="learning rate",
          labels=(("actor/lr", "actor"), ("critic/lr", "critic"))),
    Panel("Value loss (critic)", ("critic/vf_loss",), ylabel="loss", labels=(("critic/vf_loss", "value loss"),)),
    Panel("Explained variance (critic)", ("critic/vf_explained_var",), ylabel="explained variance",
          labels=(("critic/vf_explained_var", "of the returns by the values"),)),
    Panel("Response diversity (monitor)", ("monitor/unique_in_batch", "monitor/dup_in_group"), ylabel="share",
          labels=(("monitor/unique_in_batch", "distinct in batch"), ("monitor/dup_in_group", "repeated in group"))),
    # multi-turn runs (docs/agents.md): turns and calls per sample, share of calls that ran
    Panel("Tool use (multi-turn)", ("multi_turn/turns_mean", "multi_turn/calls_per_sample",
                                    "multi_turn/valid_call_share"), ylabel="per sample / share"),
    # Not drawn as a panel: each alarm's steps are marked on every other panel (plots.training_curves).
    Panel(ALARM_PANEL, pattern=r"^monitor/alarm/.+$"),
)


def read_metrics(run_dir: str | Path) -> dict[str, Series]:
    """Every numeric metric of the run as a series over steps (non-finite values dropped)."""
    path = Path(run_dir) / METRICS_FILE
    if not Path(run_dir).is_dir():
        raise UserError(f"{run_dir}: run folder not found (key 'run'); expected an RL run folder with {METRICS_FILE}")
    if not path.is_file():
        raise UserError(f"{run_dir}: no {METRICS_FILE} (key 'run'); expected an RL run folder written by "
                        "'alignctl ppo' / 'alignctl grpo'")
    series: dict[str, Series] = {}
    # A run still being written (or killed mid-write) may end in a torn line: dropped, as on resume.
    for where, row in read_jsonl(path, torn_tail=True):
        if not isinstance(row, dict) or not isinstance(row.get("step"), (int, float)):
            raise UserError(f"{where}: expected an object with a numeric 'step'")
        for key, value in row.items():
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                series.setdefault(key, []).append((float(row["step"]), float(value)))
    return series


def panel_keys(panel: Panel, available: Iterable[str]) -> list[str]:
    """The keys of ``panel`` among ``available``, in the panel's order (pattern matches sorted)."""
    available = list(available)
    keys = [k for k in panel.keys if k in available]
    if panel.pattern:
        keys += sorted(k for k in available if re.match(panel.pattern, k))
    return keys


def panel_series(series: dict[str, Series]) -> list[tuple[str, dict[str, Series]]]:
    """The panels that have data: (title, {key: series})."""
    out = []
    for panel in PANELS:
        if keys := panel_keys(panel, series):
            out.append((panel.title, {k: series[k] for k in keys}))
    return out


def summarize(panels: list[tuple[str, dict[str, Series]]]) -> dict[str, dict[str, float]]:
    """First / last / min / max of each plotted series (the report's curve table)."""
    out = {}
    for _, group in panels:
        for key, points in group.items():
            values = [v for _, v in points]
            out[key] = {"first": values[0], "last": values[-1], "min": min(values), "max": max(values),
                        "steps": float(len(values))}
    return out
