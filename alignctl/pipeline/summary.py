"""What a person wants to see after a pipeline: one line of headline numbers per stage."""

from __future__ import annotations

from typing import Any

from alignctl.console import console, print_table


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _pick(metrics: dict[str, Any], *needles: str) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in metrics.items() if any(n in k for n in needles) and isinstance(v, (int, float))]


def headline(kind: str, metrics: dict[str, Any]) -> str:
    if not metrics:
        return ""
    if kind == "preprocess":
        return ", ".join(f"{k} {v}" for k, v in (metrics.get("rows") or {}).items())
    if kind in ("init-model", "import-model"):
        return f"{metrics.get('num_parameters', 0):,} parameters"
    if kind == "sft":
        held_out = _pick(metrics, "val/loss", "val/mean_token_accuracy")[:3]
        if held_out or "train/loss_end" not in metrics:
            return ", ".join(f"{k} {_fmt(v)}" for k, v in held_out)
        return f"train loss {_fmt(metrics.get('train/loss_start'))} -> {_fmt(metrics['train/loss_end'])} (no val_files)"
    if kind == "train-rm":  # held-out numbers: what the RM will be trusted for
        text = ", ".join(f"{k} {_fmt(metrics[k])}" for k in ("val/accuracy", "val/margin_mean") if k in metrics)
        groups = [(k.removeprefix("val/accuracy/"), v) for k, v in metrics.items() if k.startswith("val/accuracy/")]
        return text + (" (by group: " + ", ".join(f"{g} {_fmt(v)}" for g, v in groups) + ")" if groups else "")
    if kind in ("ppo", "grpo"):
        return _rl_headline(metrics)
    if kind == "eval":
        win, ci = metrics.get("win_rate"), metrics.get("win_rate_ci")
        text = f"win rate {_fmt(win)}" if win is not None else ""
        if ci:
            text += f" [{_fmt(ci[0])}, {_fmt(ci[1])}]"
        extra = _pick(metrics, "lc_win_rate", "pass@1")
        if metrics.get("judge_win_rate") is not None:
            extra.append(("judge win rate", metrics["judge_win_rate"]))
        if metrics.get("rule_win_rate") is not None:
            extra.append(("rule win rate", metrics["rule_win_rate"]))
        warnings = int(metrics.get("warnings") or 0)
        flag = [f"[bold yellow]{warnings} reward-hacking warning{'s' if warnings > 1 else ''} (see report)[/]"] if warnings else []
        return ", ".join([text, *(f"{k} {_fmt(v)}" for k, v in extra), *flag]).strip(", ")
    return ""


def _val_source(key: str) -> str:
    """'before/val-core/openai/gsm8k/acc/mean@1' -> 'openai/gsm8k acc mean@1'."""
    body = key.split("/", 1)[1].removeprefix("val-core/")
    source, _, metric = body.rpartition("/acc/")
    return f"{source} acc {metric}"


def _rl_headline(metrics: dict[str, Any]) -> str:
    before = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("before/")}
    after = {k.split("/", 1)[1]: v for k, v in metrics.items() if k.startswith("after/")}
    parts = []
    for key, value in after.items():
        name = _val_source(f"after/{key}")
        parts.append(f"{name} {_fmt(before[key])} -> {_fmt(value)}" if key in before else f"{name} {_fmt(value)}")
    return ", ".join(parts) or f"{metrics.get('steps', 0)} steps"


def print_summary(outcomes: list[Any]) -> None:
    rows = [[o.name, o.kind, o.state, f"{o.seconds:.1f}s" if o.seconds else "-", headline(o.kind, o.metrics)]
            for o in outcomes]
    print_table("pipeline", ["stage", "kind", "state", "time", "headline"], rows)
    console.print("artifacts:")
    for o in outcomes:
        console.print(f"  {o.name}: {o.path}")
    for o in outcomes:
        report = o.path / "report.html"
        if o.kind == "eval" and report.exists():
            console.print(f"report ({o.name}): {report}")
