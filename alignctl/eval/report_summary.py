"""What the report says first: its one-sentence verdict, the accuracy change with its interval, and
which samples are worth reading. Pure functions of the results (no plotting, no templates).

Notation: for prompt i, ``p_i`` and ``r_i`` are the shares of the policy's and the reference's
samples that the rule scored right (pass@1 of that prompt); accuracy is their mean over prompts and
the change is ``mean(p_i - r_i)``. Its interval is a percentile bootstrap over prompts of the paired
differences (both models answered the same prompts, so pairing removes the prompts' difficulty)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from alignctl.eval.results import EvalResults
from alignctl.eval.stats import bootstrap_ci


@dataclass(frozen=True)
class AccuracyChange:
    prompts: int
    policy: float
    policy_ci: tuple[float, float]
    reference: float | None = None
    reference_ci: tuple[float, float] | None = None
    change: float | None = None  # policy - reference, in accuracy units (0.13 = 13 points)
    change_ci: tuple[float, float] | None = None


def _share_right(responses: list[dict[str, Any]] | None) -> float | None:
    marks = [r.get("correct") for r in responses or []]
    if not marks or any(m is None for m in marks):
        return None
    return sum(bool(m) for m in marks) / len(marks)


def accuracy_change(samples: list[dict[str, Any]], *, num_bootstrap: int, seed: int) -> AccuracyChange | None:
    """Per-prompt rule accuracy of the policy (and the reference, paired), with 95% intervals; None
    when no prompt has a rule verdict."""
    policy = [_share_right(s.get("policy")) for s in samples]
    reference = [_share_right(s.get("reference")) for s in samples]
    mine = np.array([p for p in policy if p is not None])
    if mine.size == 0:
        return None
    base = AccuracyChange(int(mine.size), float(mine.mean()), bootstrap_ci(mine, num_resamples=num_bootstrap, seed=seed))
    pairs = [(p, r) for p, r in zip(policy, reference) if p is not None and r is not None]
    if not pairs:
        return base
    p, r = (np.array(side) for side in zip(*pairs))
    return AccuracyChange(len(pairs), float(p.mean()), bootstrap_ci(p, num_resamples=num_bootstrap, seed=seed),
                          float(r.mean()), bootstrap_ci(r, num_resamples=num_bootstrap, seed=seed),
                          float((p - r).mean()), bootstrap_ci(p - r, num_resamples=num_bootstrap, seed=seed))


def _pct(value: float) -> str:
    return f"{100 * value:.1f}%"


def _points(value: float) -> str:
    return f"{100 * value:+.1f}"


def verdict(results: EvalResults, change: AccuracyChange | None) -> str:
    """One sentence: the held-out accuracy change, then the independent judge's preference, then the
    reward model (said to be the policy's own when it trained the policy)."""
    parts = []
    if change is not None and change.change is not None and change.reference is not None:
        low, high = change.change_ci  # type: ignore[misc]
        parts.append(f"held-out accuracy {_pct(change.reference)} → {_pct(change.policy)}, "
                     f"{_points(change.change)} points [95% CI {_points(low)}, {_points(high)}]")
    elif change is not None:
        parts.append(f"held-out accuracy {_pct(change.policy)} [95% CI {_pct(change.policy_ci[0])}, "
                     f"{_pct(change.policy_ci[1])}]")
    if results.judge_win_rate is not None and results.judge_win_rate_ci is not None:
        low, high = results.judge_win_rate_ci
        parts.append(f"an independent judge prefers the policy {_pct(results.judge_win_rate)} "
                     f"[{_pct(low)}, {_pct(high)}]")
    if results.win_rate is not None and results.win_rate_ci is not None:
        low, high = results.win_rate_ci
        who = ("the reward model it was trained on (not independent)" if results.rm_trained_policy
               else "the reward model")
        parts.append(f"{who} prefers it {_pct(results.win_rate)} [{_pct(low)}, {_pct(high)}]")
    if not parts:
        return "No verdict: the evaluation had no rule answers, judge or reward model to compare the two models by."
    sentence = "; ".join(parts)
    sentence = sentence[0].upper() + sentence[1:]
    if results.warnings:
        sentence += f" — {len(results.warnings)} warning{'s' if len(results.warnings) > 1 else ''} below"
    return sentence + "."


@dataclass(frozen=True)
class SampleChoice:
    samples: list[dict[str, Any]]
    how: str  # the sentence the page prints above them


def _first(sample: dict[str, Any], role: str) -> dict[str, Any] | None:
    return (sample.get(role) or [None])[0]


def choose_samples(results: EvalResults, limit: int) -> SampleChoice:
    """The prompts most worth reading, first response of each model: first where exactly one model is
    right (the policy's wins, then its losses), then where the reward model scores them apart, then the
    rest in prompt order, and last the prompts where both models wrote the same text."""
    groups: dict[str, list[dict[str, Any]]] = {"policy right": [], "reference right": [], "scored apart": [],
                                               "other": [], "identical": []}
    for sample in results.samples:
        policy, reference = _first(sample, "policy"), _first(sample, "reference")
        if policy is None:
            continue
        verdict_ = None
        if reference is not None and policy.get("reward") is not None and reference.get("reward") is not None:
            verdict_ = ("win" if policy["reward"] > reference["reward"] else
                        "tie" if policy["reward"] == reference["reward"] else "loss")
        entry = {**sample, "policy_first": policy, "reference_first": reference, "verdict": verdict_}
        right = (policy.get("correct"), (reference or {}).get("correct"))
        if reference is not None and policy.get("text") == reference.get("text"):
            groups["identical"].append(entry)
        elif right == (True, False):
            groups["policy right"].append(entry)
        elif right == (False, True):
            groups["reference right"].append(entry)
        elif verdict_ in ("win", "loss"):
            groups["scored apart"].append(entry)
        else:
            groups["other"].append(entry)
    chosen = [s for group in groups.values() for s in group][:limit]
    return SampleChoice(chosen, _how(groups, chosen))


def _how(groups: dict[str, list[dict[str, Any]]], chosen: list[dict[str, Any]]) -> str:
    if not any(s.get("reference_first") for s in chosen):
        return f"The first {len(chosen)} prompts in order."
    counts = {name: len(group) for name, group in groups.items()}
    parts = []
    if counts["policy right"] or counts["reference right"]:
        parts.append(f"prompts where only one model answered right first ({counts['policy right']} where only the "
                     f"policy did, then {counts['reference right']} where only the reference did)")
    if counts["scored apart"]:
        parts.append(f"then {counts['scored apart']} where the reward model scored the two apart")
    parts.append(f"then the rest in prompt order ({counts['other']})")
    if counts["identical"]:
        parts.append(f"and last {counts['identical']} where both models wrote the same answer")
    return f"Shown: {len(chosen)} of them, " + ", ".join(parts) + "."
