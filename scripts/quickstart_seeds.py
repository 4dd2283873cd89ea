"""The SmolLM2 pipelines over several seeds: the learning numbers of docs/results.md.

    .venv/bin/python scripts/quickstart_seeds.py [--pipeline quickstart|hh_smollm2] [--seeds 0 1 2] [--summary-only]

quickstart: seed ``s`` runs ``alignctl run pipelines/quickstart.yaml`` with the SFT, verifier and
reward-model trainers seeded ``s`` and the RL trainers and prompt shuffles seeded ``s + 1``, so seed 0 is exactly the
README's command (the RL seeds default to 1). The judge (its verifier and reward model) keeps its own
seed and data in every run; it starts from each seed's SFT model.

hh_smollm2: seed ``s`` seeds the PPO reward model ``s``, the judge ``s + 1`` (its default is 1), and
PPO and its prompt shuffle ``s + 1`` (their defaults are 1), eval's bootstrap ``s``, so seed 0 is exactly ``alignctl run pipelines/hh_smollm2.yaml``.

Seed 0 works in ``work/<pipeline>``, seed ``s`` in ``work/<pipeline>_s<s>``; the import is cached per
workdir. Prints one JSON line per seed (each stage's wall time and the headline numbers read back from
the stages' manifests), then mean and worst of each number over the seeds. ``--summary-only`` reads
finished workdirs without running anything. ``--json benchmarks/results/<pipeline>_seeds.json`` also
writes the rows as one record (command, machine, date), which ``scripts/render_results.py`` renders
into docs/results.md.

A shared machine's speed can move by tens of percent within an hour, so before each run
the script times a fixed float32 matrix product of a SmolLM2 layer's shape (32 x 576 by 576 x 1536, the
decode step of a rollout) on one thread and on every core, and puts the rates in the seed's line
(``probe_gflops_1t`` / ``probe_gflops_all``): a slow run on a slow machine shows as such.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Pipeline:
    headlines: list[tuple[str, str, str]]  # (label, stage, metric key); gains are computed in seed_row
    seed_overrides: Callable[[int], list[str]]


def _quickstart_overrides(seed: int) -> list[str]:
    rl = seed + 1
    return [f"sft.trainer.seed={seed}", f"verifier.trainer.seed={seed}", f"reward_model.trainer.seed={seed}",
            f"grpo.trainer.seed={rl}", f"grpo.data.seed={rl}", f"ppo.trainer.seed={rl}", f"ppo.data.seed={rl}"]


def _hh_overrides(seed: int) -> list[str]:
    other = seed + 1
    return [f"reward_model.trainer.seed={seed}", f"judge.trainer.seed={other}", f"ppo.trainer.seed={other}",
            f"ppo.data.seed={other}", f"eval.seed={seed}"]


PIPELINES = {
    "quickstart": Pipeline([
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
        ("grpo_judge_rule_agreement", "eval_grpo", "judge_rule_agreement"),
        ("ppo_judge_rule_agreement", "eval_ppo", "judge_rule_agreement"),
        ("ppo_rm_rule_agreement", "eval_ppo", "rm_rule_agreement"),
    ], _quickstart_overrides),
    "hh_smollm2": Pipeline([
        ("rm_accuracy_half_b", "eval", "preference_accuracy"),
        ("rm_val_accuracy", "reward_model", "val/accuracy"),
        ("judge_val_accuracy", "judge", "val/accuracy"),
        ("ppo_judge_win", "eval", "judge_win_rate"),
        ("ppo_judge_win_ci_low", "eval", "judge_win_rate_ci_low"),
        ("ppo_own_rm_win", "eval", "win_rate"),
        ("ppo_own_rm_win_ci_low", "eval", "win_rate_ci_low"),
        ("policy_length", "eval", "mean_length"),
        ("reference_length", "eval", "reference_mean_length"),
        ("policy_repetitive", "eval", "repetition_rate"),
        ("reference_repetitive", "eval", "reference_repetition_rate"),
    ], _hh_overrides),
}


def probe_gflops(threads: int, seconds: float = 2.0) -> float:
    """Sustained float32 GFLOP/s of a rollout-shaped matrix product on ``threads`` torch threads."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(32, 576), torch.randn(576, 1536)
        for _ in range(20):  # warm-up: thread pool, caches
            torch.mm(a, b)
        done, start = 0, time.perf_counter()
        while time.perf_counter() - start < seconds:
            for _ in range(100):
                torch.mm(a, b)
            done += 100
        return round(done * 2 * 32 * 576 * 1536 / (time.perf_counter() - start) / 1e9, 1)
    finally:
        torch.set_num_threads(before)


def workdir(pipeline: str, seed: int) -> Path:
    return ROOT / "work" / (pipeline if seed == 0 else f"{pipeline}_s{seed}")


def newest_manifests(folder: Path) -> dict[str, dict]:
    """Stage name -> the manifest of its newest artifact in ``folder``."""
    found: dict[str, dict] = {}
    for path in folder.glob("*/manifest.json"):
        manifest = json.loads(path.read_text())
        name = manifest["name"]
        if name not in found or manifest["created_unix"] > found[name]["created_unix"]:
            found[name] = manifest
    return found


def seed_row(pipeline: str, seed: int, wall_s: float | None) -> dict:
    manifests = newest_manifests(workdir(pipeline, seed))
    row: dict = {"seed": seed, "workdir": str(workdir(pipeline, seed).relative_to(ROOT))}
    for label, stage, key in PIPELINES[pipeline].headlines:
        row[label] = manifests.get(stage, {}).get("metrics", {}).get(key)
    for stage, prefix in (("reward_model", "rm"), ("judge", "judge")):  # accuracy per kind of wrong answer
        for key, value in manifests.get(stage, {}).get("metrics", {}).items():
            if key.startswith("val/accuracy/"):
                row[f"{prefix}_accuracy_{key.removeprefix('val/accuracy/')}"] = value
    for policy in ("grpo", "ppo"):
        if row.get(f"{policy}_accuracy") is not None and row.get("sft_accuracy") is not None:
            row[f"{policy}_gain_pts"] = round(100 * (row[f"{policy}_accuracy"] - row["sft_accuracy"]), 1)
    if row.get("policy_length") and row.get("reference_length"):
        row["length_change_pct"] = round(100 * (row["policy_length"] / row["reference_length"] - 1), 1)
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


def machine() -> str:
    """The processor, the cores this process may use and whether it multiplies bf16 natively."""
    from alignctl.cores import available_cores

    model, flags = "an unknown CPU", ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model == "an unknown CPU":
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = value
    except OSError:  # not Linux: the model name stays unknown
        pass
    bf16 = "with" if {"avx512_bf16", "amx_bf16"} & set(flags.split()) else "without"
    return f"{available_cores()} cores of {model}, {bf16} bf16 matrix instructions"


def record(pipeline: str, rows: list[dict]) -> dict:
    """What docs/results.md renders: the rows and how they were measured."""
    extra = "" if pipeline == "quickstart" else f" --pipeline {pipeline}"
    return {"name": f"{pipeline}_seeds", "pipeline": pipeline,
            "command": f"bash scripts/setup.sh && .venv/bin/python scripts/quickstart_seeds.py{extra}",
            "machine": machine(), "date": time.strftime("%Y-%m-%d", time.gmtime()), "rows": rows}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pipeline", choices=sorted(PIPELINES), default="quickstart")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--summary-only", action="store_true", help="Read finished workdirs; run nothing.")
    parser.add_argument("--json", type=Path, help="Also write the rows as one record for scripts/render_results.py.")
    args = parser.parse_args()
    from alignctl.cores import available_cores

    rows = []
    for seed in args.seeds:
        wall, probe = None, {}
        if not args.summary_only:
            probe = {"probe_gflops_1t": probe_gflops(1), "probe_gflops_all": probe_gflops(available_cores())}
            start = time.perf_counter()
            done = subprocess.run(  # -m from ROOT: this checkout's alignctl, even where the venv points elsewhere
                [sys.executable, "-m", "alignctl", "run", str(ROOT / "pipelines" / f"{args.pipeline}.yaml"),
                 *PIPELINES[args.pipeline].seed_overrides(seed), f"workdir={workdir(args.pipeline, seed)}"], cwd=ROOT)
            wall = time.perf_counter() - start
            if done.returncode != 0:
                print(f"seed {seed}: alignctl run exited {done.returncode}", file=sys.stderr)
                return done.returncode
        rows.append({**seed_row(args.pipeline, seed, wall), **probe})
        print(json.dumps(rows[-1]), flush=True)
    print(json.dumps({"pipeline": args.pipeline, "seeds": args.seeds, "summary": summarize(rows)}))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(record(args.pipeline, rows), indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
