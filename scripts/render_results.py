"""Render the measured tables of docs/results.md from the JSON records in benchmarks/results/.

    .venv/bin/python scripts/render_results.py            # rewrite the rendered blocks in place
    .venv/bin/python scripts/render_results.py --check    # exit 1 when the page and the records differ

A record is one measurement: ``name``, ``command``, ``machine``, ``date`` and its numbers
(``scripts/quickstart_seeds.py --json`` writes ``rows``, one per seed). docs/results.md holds each
rendered table between ``<!-- rendered: NAME -->`` and ``<!-- /rendered -->``; the text around the
blocks is written by hand. Refresh a number by running the command with ``--json`` into
benchmarks/results/ and then this script, not by editing the table.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RECORDS = ROOT / "benchmarks" / "results"
PAGE = ROOT / "docs" / "results.md"
BLOCK = re.compile(r"(<!-- rendered: (\S+) -->\n)(.*?)(<!-- /rendered -->)", re.S)

Row = dict[str, Any]


def _num(value: Any, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _rate(value: Any) -> str:
    """A win rate: 4 decimals, as eval reports a share of 200 or 400 verdicts (ties count half)."""
    return _num(value, 4)


def _gain(value: float | None) -> str:
    return "-" if value is None else f"{value:+.1f}"


def _with_low(rows: list[Row], key: str, i: int) -> str:
    return f"{_rate(rows[i][key])} ({_rate(rows[i][key + '_ci_low'])})"


def _mean_worst(rows: list[Row], key: str, fmt: Callable[[Any], str], worst: Callable[..., Any] = min) -> str:
    values = [r[key] for r in rows if r.get(key) is not None]
    if len(values) != len(rows):
        return "-"
    return f"{fmt(statistics.fmean(values))} / {fmt(worst(values))}"


def _minutes(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds / 60:.1f} min"


def quickstart_seeds(record: dict[str, Any]) -> list[str]:
    """One line per seed, then mean / worst (worst: the lowest number, the longest run)."""
    rows = record["rows"]
    lines = ["| seed | SFT | GRPO | PPO | reward model / judge | GRPO win rate, judge (CI low) | "
             "PPO win rate, judge (CI low) | PPO win rate, own RM | whole run |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        lines.append(f"| {r['seed']} | {_num(r['sft_accuracy'])} | {_num(r['grpo_accuracy'])} ({_gain(r['grpo_gain_pts'])}) "
                     f"| {_num(r['ppo_accuracy'])} ({_gain(r['ppo_gain_pts'])}) "
                     f"| {_num(r['rm_accuracy'])} / {_num(r['judge_accuracy'])} | {_with_low(rows, 'grpo_judge_win', i)} "
                     f"| {_with_low(rows, 'ppo_judge_win', i)} | {_rate(r['ppo_own_rm_win'])} | {_minutes(r['run_wall_s'])} |")
    lines.append(f"| **mean / worst** | {_mean_worst(rows, 'sft_accuracy', _num)} "
                 f"| {_mean_worst(rows, 'grpo_gain_pts', _gain)} | {_mean_worst(rows, 'ppo_gain_pts', _gain)} "
                 f"| RM {_mean_worst(rows, 'rm_accuracy', _num)}, judge {_mean_worst(rows, 'judge_accuracy', _num)} "
                 f"| {_mean_worst(rows, 'grpo_judge_win', _rate)} | {_mean_worst(rows, 'ppo_judge_win', _rate)} "
                 f"| {_mean_worst(rows, 'ppo_own_rm_win', _rate)} | {_mean_worst(rows, 'run_wall_s', _minutes, max)} |")
    return lines


def hh_smollm2_seeds(record: dict[str, Any]) -> list[str]:
    rows = record["rows"]
    seeds = [str(r["seed"]) for r in rows]
    lines = ["| seed | " + " | ".join(seeds) + " | mean |", "|---" * (len(rows) + 2) + "|"]

    def line(label: str, key: str, fmt: Callable[[Any], str]) -> str:
        values = [r.get(key) for r in rows]
        mean = fmt(statistics.fmean(values)) if None not in values else "-"
        return f"| {label} | " + " | ".join(fmt(v) if v is not None else "-" for v in values) + f" | {mean} |"

    lines.append(line("PPO reward model, accuracy on all of half B", "rm_accuracy_half_b", _rate))
    lines.append(f"| policy vs SmolLM2, win rate by the judge (95% CI low) | "
                 + " | ".join(_with_low(rows, "ppo_judge_win", i) for i in range(len(rows)))
                 + f" | {_num(statistics.fmean(r['ppo_judge_win'] for r in rows))} |")
    lines.append(line("win rate by the PPO reward model", "ppo_own_rm_win", _num))
    lines.append(line("mean response length, policy vs SmolLM2", "length_change_pct", lambda v: f"{v:+.1f}%"))
    lines.append(line("responses repeating a 4-word phrase 3+ times, policy", "policy_repetitive", lambda v: f"{100 * v:.1f}%"))
    lines.append(line("the same, SmolLM2", "reference_repetitive", lambda v: f"{100 * v:.1f}%"))
    stages = list(rows[0]["stage_wall_s"])
    lines.append(f"| {' / '.join(stages)} (s) | "
                 + " | ".join(" / ".join(str(r["stage_wall_s"][s]) for s in stages) for r in rows) + " | |")
    return lines


# The alarms a planted exploit can show up as (benchmarks/monitor_exploits.py HACKING_ALARMS).
HACKING_ALARMS = ("reward_hacking", "length_blowup", "length_collapse", "entropy_collapse", "mode_collapse")


def _exploit_delay(row: Row) -> int | None:
    """First hacking-kind alarm minus the first onset (accuracy or length), as the suite defines it."""
    onsets = [row[k] for k in ("gold_onset", "length_onset", "length_low_onset") if row.get(k) is not None]
    alarms = [s for name, s in row.get("alarms", {}).items() if name in HACKING_ALARMS]
    return min(alarms) - min(onsets) if onsets and alarms else None


def _onsets(row: Row) -> str:
    length = row.get("length_onset") or row.get("length_low_onset")
    return f"{row.get('gold_onset') or '-'} / {length or '-'}"


def monitor_exploits(record: dict[str, Any]) -> list[str]:
    """One line per run (onset from the gold accuracy / the length, the first step of each alarm,
    the delay), then per stage and exploit: the median and worst delay, and the healthy control's
    hacking-kind alarms (false alarms)."""
    rows = [r for r in record["rows"] if "error" not in r]
    lines = ["| stage | exploit | seed | steps | acc, baseline -> last | length, baseline -> last | onset (acc / length) "
             "| alarms (first step) | delay | s/step |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        alarms = ", ".join(f"{name} {step}" for name, step in sorted(r["alarms"].items(), key=lambda a: a[1])) or "none"
        delay = _exploit_delay(r)
        lines.append(f"| {r.get('stage', 'grpo')} | {r['exploit']} | {r['seed']} | {r['steps']} "
                     f"| {r['baseline_acc']:.3f} -> {r['acc'][-1]:.3f} | {r['baseline_length']:.1f} -> {r['length'][-1]:.1f} "
                     f"| {_onsets(r)} | {alarms} | {'-' if delay is None else delay} "
                     f"| {_num(r.get('step_s'), 1)} |")
    lines += ["", "| stage | exploit | runs | runs with an onset | alarmed after it | delay, median / worst "
              "| hacking-kind alarms without an onset |", "|---|---|---|---|---|---|---|"]
    groups: dict[tuple[str, str], list[Row]] = {}
    for r in rows:
        groups.setdefault((r.get("stage", "grpo"), r["exploit"]), []).append(r)
    for (stage, exploit), members in groups.items():
        with_onset = [r for r in members if r.get("gold_onset") or r.get("length_onset") or r.get("length_low_onset")]
        delays = [d for r in with_onset if (d := _exploit_delay(r)) is not None]
        spread = f"{statistics.median(delays):g} / {max(delays)}" if delays else "-"
        false = sum(1 for r in members if r not in with_onset and any(a in HACKING_ALARMS for a in r["alarms"]))
        lines.append(f"| {stage} | {exploit} | {len(members)} | {len(with_onset)} | {len(delays)} | {spread} | {false} |")
    failed = [r for r in record["rows"] if "error" in r]
    if failed:
        lines += ["", "Runs that failed: " + ", ".join(f"{r.get('stage', 'grpo')} {r['exploit']} seed {r['seed']} "
                                                       f"(exit {r['exit']})" for r in failed) + "."]
    return lines


RENDERERS: dict[str, Callable[[dict[str, Any]], list[str]]] = {
    "quickstart_seeds": quickstart_seeds,
    "hh_smollm2_seeds": hh_smollm2_seeds,
    "monitor_exploits": monitor_exploits,
}


def render_block(record: dict[str, Any]) -> str:
    """The table, then the line that says how it was measured."""
    table = RENDERERS[record["name"]](record)
    source = f"Measured {record['date']} on {record['machine']}: `{record['command']}`."
    return "\n".join([*table, "", source]) + "\n"


def load_records(folder: Path = RECORDS) -> dict[str, dict[str, Any]]:
    records = {}
    for path in sorted(folder.glob("*.json")):
        record = json.loads(path.read_text(encoding="utf-8"))
        if record.get("name") in RENDERERS:
            records[record["name"]] = record
    return records


def render_page(text: str, records: dict[str, dict[str, Any]]) -> str:
    """``text`` with every rendered block replaced; a block without a record is an error."""
    def replace(match: re.Match[str]) -> str:
        name = match.group(2)
        if name not in records:
            raise SystemExit(f"docs/results.md: no record named {name!r} in {RECORDS}")
        return match.group(1) + render_block(records[name]) + match.group(4)

    return BLOCK.sub(replace, text)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 when the page is not what the records render")
    args = parser.parse_args(argv)
    text = PAGE.read_text(encoding="utf-8")
    rendered = render_page(text, load_records())
    if args.check:
        if rendered != text:
            print("docs/results.md differs from benchmarks/results/*.json: run scripts/render_results.py", file=sys.stderr)
            return 1
        return 0
    PAGE.write_text(rendered, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
