"""The quickstart on SmolLM2 over several seeds: the learning numbers docs/quickstart.md reports (issue 16).

    .venv/bin/python scripts/quickstart_seeds.py [--seeds 0 1 2] [--summary-only]

Seed ``s`` runs ``alignctl run pipelines/quickstart.yaml`` with the SFT and reward-model trainers seeded
``s`` and the RL trainers and prompt shuffles seeded ``s + 1``, so seed 0 is exactly the README's
command (the RL seeds default to 1). Seed 0 works in ``work/quickstart``, seed ``s`` in
``work/quickstart_s<s>``; the import is cached per workdir. The judge reward model keeps its own
seed and data in every run, so all seeds are judged the same way.

Prints one JSON line per seed (each stage's wall time and the headline numbers read back from the
stages' manifests), then mean and worst of each number over the seeds. ``--summary-only`` reads
finished workdirs without running anything.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PIPELINE = ROOT / "pipelines" / "quickstart.yaml"
# Headline numbers: (label, stage, metric key); gains are computed below.
HEADLINES = [
    ("rm_accuracy", "reward_model", "val/accuracy"),
    ("judge_accuracy", "judge", "val/accuracy"),
    ("sft_accuracy", "eval_grpo", "reference_accuracy/arith/pass@1"),
    ("grpo_accuracy", "eval_grpo", "accuracy/arith/pass@1"),
    ("ppo_accuracy", "eval_ppo", "accuracy/arith/pass@1"),
    ("grpo_judge_win", "eval_grpo", "judge_win_rate"),
    ("grpo_judge_win_ci_low", "eval_grpo", "judge_win_rate_ci_low"),
    ("ppo_judge_win", "eval_ppo", "judge_win_rate"),
    ("ppo_judge_win_ci_low", "eval_ppo", "judge_win_rate_ci_low"),
    ("ppo_own_rm_win", "eval_ppo", "win_rate"),
]


def workdir(seed: int) -> Path:
    return ROOT / "work" / ("quickstart" if seed == 0 else f"quickstart_s{seed}")


def overrides(seed: int) -> list[str]:
    rl = seed + 1
    return [f"sft.trainer.seed={seed}", f"reward_model.trainer.seed={seed}",
            f"grpo.trainer.seed={rl}", f"grpo.data.seed={rl}", f"ppo.trainer.seed={rl}", f"ppo.data.seed={rl}",
            f"workdir={workdir(seed)}"]


def newest_manifests(folder: Path) -> dict[str, dict]:
    """Stage name -> the manifest of its newest artifact in ``folder``."""
    found: dict[str, dict] = {}
    for path in folder.glob("*/manifest.json"):
        manifest = json.loads(path.read_text())
        name = manifest["name"]
        if name not in found or manifest["created_unix"] > found[name]["created_unix"]:
            found[name] = manifest
    return found


def seed_row(seed: int, wall_s: float | None) -> dict:
    manifests = newest_manifests(workdir(seed))
    row: dict = {"seed": seed, "workdir": str(workdir(seed).relative_to(ROOT))}
    for label, stage, key in HEADLINES:
        row[label] = manifests.get(stage, {}).get("metrics", {}).get(key)
    for stage, prefix in (("reward_model", "rm"), ("judge", "judge")):  # accuracy per kind of wrong answer
        for key, value in manifests.get(stage, {}).get("metrics", {}).items():
            if key.startswith("val/accuracy/"):
                row[f"{prefix}_accuracy_{key.removeprefix('val/accuracy/')}"] = value
    for policy in ("grpo", "ppo"):
        if row[f"{policy}_accuracy"] is not None and row["sft_accuracy"] is not None:
            row[f"{policy}_gain_pts"] = round(100 * (row[f"{policy}_accuracy"] - row["sft_accuracy"]), 1)
    row["stage_wall_s"] = {name: round(m["wall_time_s"]) for name, m in sorted(manifests.items())}
    row["stages_wall_s"] = round(sum(m["wall_time_s"] for m in manifests.values()))
    row["run_wall_s"] = None if wall_s is None else round(wall_s)
    return row


def summarize(rows: list[dict]) -> dict:
    summary: dict = {}
    for key, value in rows[0].items():
        values = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if key != "seed" and isinstance(value, (int, float)) and len(values) == len(rows):
            # Worst = the lowest for every number here (accuracies, gains, win rates; wall times excepted).
            worst = max(values) if key.endswith("wall_s") else min(values)
            summary[key] = {"mean": round(statistics.fmean(values), 4), "worst": worst}
    return summary


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--summary-only", action="store_true", help="Read finished workdirs; run nothing.")
    args = parser.parse_args()
    rows = []
    for seed in args.seeds:
        wall = None
        if not args.summary_only:
            start = time.perf_counter()
            done = subprocess.run(  # -m from ROOT: this checkout's alignctl, even where the venv points elsewhere
                [sys.executable, "-m", "alignctl", "run", str(PIPELINE), *overrides(seed)], cwd=ROOT)
            wall = time.perf_counter() - start
            if done.returncode != 0:
                print(f"seed {seed}: alignctl run exited {done.returncode}", file=sys.stderr)
                return done.returncode
        rows.append(seed_row(seed, wall))
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"seeds": args.seeds, "summary": summarize(rows)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
