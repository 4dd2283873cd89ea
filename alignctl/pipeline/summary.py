"""What a person wants to see after a pipeline: one line of headline numbers per stage."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from alignctl.console import clip, console
from alignctl.tracking import ALARM_PREFIX, REWARD_KEY, duration_text, gold_key


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def headline(kind: str, metrics: dict[str, Any]) -> str:
    if not metrics:
        return ""
    if kind == "preprocess":
        return ", ".join(f"{k.removesuffix('.parquet')} {v}" for k, v in (metrics.get("rows") or {}).items())
    if kind in ("init-model", "import-model"):
        return f"{metrics.get('num_parameters', 0):,} parameters"
    if kind == "sft":
        if "val/loss" in metrics:
            start = metrics.get("val/loss_start")
            text = f"val loss {_fmt(start)} -> {_fmt(metrics['val/loss'])}" if start is not None else \
                f"val loss {_fmt(metrics['val/loss'])}"
            accuracy = metrics.get("val/mean_token_accuracy")
            return text + (f", token acc {_fmt(accuracy)}" if accuracy is not None else "")
        if "train/loss_end" not in metrics:
            return ""
        return f"train loss {_fmt(metrics.get('train/loss_start'))} -> {_fmt(metrics['train/loss_end'])} (no val_files)"
    if kind == "train-rm":  # held-out numbers: what the RM will be trusted for
        text = ", ".join(f"{k} {_fmt(metrics[k])}" for k in ("val/accuracy", "val/margin_mean") if k in metrics)
        groups = [(k.removeprefix("val/accuracy/"), v) for k, v in metrics.items() if k.startswith("val/accuracy/")]
        return text + (" (by group: " + ", ".join(f"{g} {_fmt(v)}" for g, v in groups) + ")" if groups else "")
    if kind in ("ppo", "grpo"):
        return _rl_headline(metrics)
    if kind == "eval":
        return _eval_headline(metrics)
    return ""


def _eval_headline(metrics: dict[str, Any]) -> str:
    """Held-out accuracy (reference -> policy), then the independent judge, then the reward model that
    trained the policy (if any), then the rule and reward-hacking warnings."""
    parts = []
    for key, value in metrics.items():
        if key.startswith("accuracy/") and key.endswith("/pass@1"):
            ref = metrics.get("reference_" + key)
            parts.append(f"pass@1 {_fmt(ref)} -> {_fmt(value)} ({(value - ref) * 100:+.1f} pts)"
                         if isinstance(ref, (int, float)) else f"pass@1 {_fmt(value)}")
    for name, key in (("judge win rate", "judge_win_rate"), ("RM win rate", "win_rate"),
                      ("rule win rate", "rule_win_rate")):
        if metrics.get(key) is not None:
            low, high = metrics.get(f"{key}_ci_low"), metrics.get(f"{key}_ci_high")
            ci = metrics.get(f"{key}_ci")  # older manifests
            if ci and low is None:
                low, high = ci
            parts.append(f"{name} {_fmt(metrics[key])}" + (f" [{_fmt(low)}, {_fmt(high)}]" if low is not None else ""))
    parts += [f"lc_win_rate {_fmt(metrics['lc_win_rate'])}"] if metrics.get("lc_win_rate") is not None else []
    warnings = int(metrics.get("warnings") or 0)
    if warnings:
        parts.append(f"[bold yellow]{warnings} reward-hacking warning{'s' if warnings > 1 else ''} (see report)[/]")
    return ", ".join(parts)


def _val_source(key: str) -> str:
    """'before/val-core/openai/gsm8k/acc/mean@1' -> 'openai/gsm8k acc mean@1'."""
    body = key.split("/", 1)[1].removeprefix("val-core/")
    source, _, metric = body.rpartition("/acc/")
    return f"{source} acc {metric}"


def _rl_headline(metrics: dict[str, Any]) -> str:
    """Reward and accuracy at the start and the end of the run, then its alarms."""
    parts = []
    if "reward/start" in metrics and "reward/end" in metrics:
        parts.append(f"reward {_fmt(metrics['reward/start'])} -> {_fmt(metrics['reward/end'])}")
    before = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("before/")}
    after = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("after/")}
    single = len(after) == 1
    for key, value in after.items():
        name = "val acc" if single else _val_source(f"after/{key}")
        parts.append(f"{name} {_fmt(before[key])} -> {_fmt(value)}" if key in before else f"{name} {_fmt(value)}")
    if not after and "gold/start" in metrics and "gold/end" in metrics:
        parts.append(f"gold {_fmt(metrics['gold/start'])} -> {_fmt(metrics['gold/end'])}")
    alarms = metrics.get("alarms") or []
    if alarms:
        parts.append(f"alarm{'s' if len(alarms) > 1 else ''}: {', '.join(alarms)}")
    return ", ".join(parts) or f"{metrics.get('steps', 0)} steps"


def run_digest(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Start/end means of the reward (and of a per-step gold accuracy, :func:`~alignctl.tracking.gold_key`)
    over the first and last quarter of the training steps (at most 4 steps each: one step is noisy),
    and the alarms that fired, from an RL run's metrics.jsonl rows."""
    steps = [r for r in rows if REWARD_KEY in r]
    gold = gold_key(steps[0]) if steps else None
    out: dict[str, Any] = {}
    for name, key in (("reward", REWARD_KEY), ("gold", gold)):
        values = [float(r[key]) for r in steps if key is not None and isinstance(r.get(key), (int, float))]
        if values:
            k = max(1, min(4, len(values) // 4))
            out[f"{name}/start"], out[f"{name}/end"] = sum(values[:k]) / k, sum(values[-k:]) / k
    alarms = sorted({key.removeprefix(ALARM_PREFIX) for r in rows for key in r if key.startswith(ALARM_PREFIX)})
    if alarms:
        out["alarms"] = alarms
    return out


def read_run_digest(folder: Path) -> dict[str, Any]:
    """:func:`run_digest` of ``folder/metrics.jsonl`` ({} when the file is missing or unreadable)."""
    try:
        lines = (folder / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
        return run_digest([json.loads(line) for line in lines if line.strip()])
    except (OSError, ValueError):
        return {}


def concerns(kind: str, metrics: dict[str, Any]) -> list[str]:
    """What looks wrong in a finished stage's numbers: one short phrase each."""
    found = []
    for name, (start_key, end_key) in (("train loss", ("train/loss_start", "train/loss_end")),
                                       ("val loss", ("val/loss_start", "val/loss"))):
        start, end = metrics.get(start_key), metrics.get(end_key)
        if isinstance(start, (int, float)) and isinstance(end, (int, float)) and end > start:
            found.append(f"{name} rose {_fmt(start)} -> {_fmt(end)}")
    if kind in ("ppo", "grpo"):
        if metrics.get("alarms"):
            found.append(f"alarm{'s' if len(metrics['alarms']) > 1 else ''} fired: {', '.join(metrics['alarms'])}")
        if metrics.get("reward/end", 0.0) < metrics.get("reward/start", 0.0):
            found.append(f"reward fell {_fmt(metrics['reward/start'])} -> {_fmt(metrics['reward/end'])}")
        for key, value in metrics.items():
            before = metrics.get("before/" + key.removeprefix("after/"))
            if key.startswith("after/") and isinstance(before, (int, float)) and value < before:
                found.append(f"{_val_source(key)} fell {_fmt(before)} -> {_fmt(value)}")
    if kind == "eval" and int(metrics.get("warnings") or 0):
        found.append(f"{int(metrics['warnings'])} reward-hacking warning(s) in the report")
    return found


def status_lines(title: str, workdir: Path, stages: list[tuple[str, str, str, dict[str, Any]]],
                 width: int = 80, seconds: dict[str, float] | None = None) -> list[str]:
    """``alignctl status`` (and the end of ``alignctl run``) as plain lines of at most ``width``
    columns: one per stage (name, kind, state, the time it took when ``seconds`` has it, headline),
    then the warnings. ``stages``: (name, kind, state, metrics) in run order."""
    name_w = max([5, *(len(s[0]) for s in stages)])
    kind_w = max([4, *(len(s[1]) for s in stages)])
    counts = {state: sum(1 for s in stages if s[2] == state) for state in dict.fromkeys(s[2] for s in stages)}
    summary = ", ".join(f"{n} {state}" for state, n in counts.items())
    timed = seconds is not None
    lines = [clip(f"{title}: {summary}", width), clip(f"artifacts: {workdir}/<stage>-<key12>", width),
             f"{'stage':<{name_w}}  {'kind':<{kind_w}}  {'state':<7}  " + ("  time  " if timed else "") + "headline"]
    warnings = []
    for name, kind, state, metrics in stages:
        done = state in ("cached", "ran")
        text = _plain(headline(kind, metrics)) if done else ""
        took = (duration_text(seconds[name]) if seconds.get(name) else "-") if seconds is not None else ""
        lines.append(clip(f"{name:<{name_w}}  {kind:<{kind_w}}  {state:<7}  " + (f"{took:>6}  " if timed else "")
                          + text, width).rstrip())
        warnings += [f"  {name}: {item}" for item in concerns(kind, metrics)] if done else []
    if warnings:
        lines += ["warnings:", *(clip(w, width) for w in warnings)]
    return lines


def _plain(text: str) -> str:
    """A headline without rich markup (status prints plain text)."""
    return re.sub(r"\[/?[a-z ]*\]", "", text)


def print_summary(outcomes: list[Any], workdir: Path | None = None) -> None:
    """What ``alignctl run`` prints at the end: the stages as ``alignctl status`` shows them, with the
    time each took, then where each eval's report is."""
    import shutil

    width = shutil.get_terminal_size((100, 24)).columns
    folder = workdir if workdir is not None else (outcomes[0].path.parent if outcomes else Path("."))
    stages = [(o.name, o.kind, o.state, o.metrics) for o in outcomes]
    for line in status_lines("pipeline", folder, stages, width, seconds={o.name: o.seconds for o in outcomes}):
        console.print(line, markup=False, highlight=False)
    for o in outcomes:
        report = o.path / "report.html"
        if o.kind == "eval" and report.exists():
            console.print(f"report ({o.name}): {report}", markup=False)
