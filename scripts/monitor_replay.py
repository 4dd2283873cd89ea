"""Replay RL runs' metrics.jsonl through today's monitor (default thresholds, or the run's own
``monitor`` section from its config.yaml) and print every alarm it raises.

The monitor is a pure function of the logged metrics, so a replay raises exactly the alarms a live
run with this code would have raised. Used to check that healthy runs raise none:

    .venv/bin/python scripts/monitor_replay.py work/quickstart_tiny/ppo-* work/quickstart_tiny/grpo-*
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from alignctl.config.core import build_config
from alignctl.config.rl import MonitorConfig
from alignctl.monitor import Monitor, Thresholds
from alignctl.trainers.rl_trainer import make_monitor


def replay(run_dir: Path) -> tuple[int, list[str]]:
    config = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").exists() else {}
    section = (config or {}).get("monitor")
    # Keys the run's config predates take today's defaults.
    monitor = make_monitor(build_config(MonitorConfig, section)) if section else Monitor(Thresholds())
    lines, steps = [], 0
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        step = int(row.pop("step"))
        steps = max(steps, step)
        metrics = {k: v for k, v in row.items() if not k.startswith("monitor/alarm/")}
        lines += [alarm.line() for alarm in monitor.observe(step, metrics)]
    return steps, lines


def main() -> int:
    total = 0
    for name in sys.argv[1:]:
        steps, alarms = replay(Path(name))
        total += len(alarms)
        print(f"{name}: {steps} steps, {len(alarms)} alarm(s)" + "".join(f"\n  {a}" for a in alarms))
    return 1 if total else 0


if __name__ == "__main__":
    sys.exit(main())
