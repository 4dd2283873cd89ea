"""Parked workers (``trainer.reuse_workers: true``, the default) vs fresh worker processes for every run.

The work is a series of short GRPO runs in one driver process, as a pipeline's RL stages, an API sweep
or the test suite make them: a tiny Llama (the test suite's size, 2 blocks of 64) on arith prompts, 2
steps of 4 prompts x 2 answers on a pool of ``--workers`` CPU workers. Both sides run in this process
against one local Ray cluster, alternating (fresh, parked, fresh, parked, ...) so a load change hits
both alike:

- fresh: ``trainer.reuse_workers=false``, and any parked group is stopped before the run, so every
  run starts its own worker processes (what every run did before parking existed);
- parked: ``trainer.reuse_workers=true`` after a run of the same shape, so the run takes over the
  processes that run left.

It prints the median wall time of a run on each side and the ratio (fresh / parked), and the CPU
seconds the whole machine spent per run (workers included, read from /proc/stat on Linux). It also
checks that both sides logged the same metrics (timings aside) and exits 1 if they did not: taking
over a process must not change what a run computes.

Run: ``python benchmarks/worker_reuse.py [--quick] [--json out.json] [--workers N] [--runs N]``
(default: 2 workers, 4 runs per side; --quick: 2 runs per side).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, summarize  # noqa: E402

TIME_DEPENDENT = ("timing_s", "perf/")
# A dense reward (the share of digits in the answer), so a random tiny model gets a signal to train on.
DIGIT_REWARD = """
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return sum(ch.isdigit() for ch in solution_str) / len(solution_str) if solution_str else 0.0
"""


def machine_cpu_seconds() -> float:
    """Busy CPU seconds of the whole machine so far (user, nice, system, irq, softirq, steal); 0 off Linux."""
    try:
        fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    except OSError:
        return 0.0
    ticks = [int(v) for v in fields]
    return (sum(ticks[:3]) + sum(ticks[5:8])) / os.sysconf("SC_CLK_TCK")


def build_assets(root: Path) -> dict[str, Path]:
    """Arith prompts, a tiny character-level Llama fitted to their alphabet (random weights), the reward file."""
    from alignctl.config.preprocess import ArithConfig, PreprocessConfig
    from alignctl.data.preprocess import run_preprocess
    from alignctl.models.tiny import init_model

    data = root / "arith"
    run_preprocess(PreprocessConfig(dataset="arith", out=str(data), seed=0,
                                    arith=ArithConfig(num_train=32, num_test=8, num_sft=8, num_pref=8)), progress=False)
    model = root / "model"
    init_model(out=model, tokenizer_from=[data / "train.parquet"], hidden=64, layers=2, tokenizer_kind="char", seed=0)
    reward = root / "digit_reward.py"
    reward.write_text(DIGIT_REWARD, encoding="utf-8")
    return {"data": data, "model": model, "reward": reward}


def run_once(assets: dict[str, Path], run_dir: Path, workers: int, reuse: bool) -> dict[str, Any]:
    """One GRPO run; its wall time, the machine's CPU seconds and its untimed metrics."""
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig
    from alignctl.trainers.rl_trainer import RLTrainer
    from alignctl.workers.group import stop_parked

    cfg = load_config(RLConfig, None, [
        f"data.train_files=[{assets['data'] / 'train.parquet'}]", f"actor_rollout_ref.model.path={assets['model']}",
        f"trainer.run_dir={run_dir}", f"custom_reward_function.path={assets['reward']}", "algorithm.adv_estimator=grpo", "data.train_batch_size=4",
        "data.max_prompt_length=128", "data.max_response_length=16", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.optim.lr=1e-3", "trainer.total_training_steps=2",
        f"trainer.n_gpus_per_node={workers}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
        f"trainer.reuse_workers={str(reuse).lower()}"])
    if not reuse:
        stop_parked()
    cpu, start = machine_cpu_seconds(), time.perf_counter()
    RLTrainer(cfg).fit()
    wall, cpu = time.perf_counter() - start, machine_cpu_seconds() - cpu
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return {"wall": wall, "cpu": cpu,
            "metrics": [{k: v for k, v in row.items() if not k.startswith(TIME_DEPENDENT)} for row in rows]}


def main() -> int:
    args = parse_bench_args(__doc__.splitlines()[0], extra=lambda p: (
        p.add_argument("--workers", type=int, default=2, help="CPU workers in the pool (default 2)"),
        p.add_argument("--runs", type=int, default=None, help="runs per side (default 4; --quick: 2)")))
    runs = args.runs or (2 if args.quick else 4)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from alignctl.workers.group import init_ray, shutdown_ray

    with tempfile.TemporaryDirectory(prefix="alignctl-bench-reuse-") as tmp:
        root = Path(tmp)
        assets = build_assets(root)
        init_ray(None, num_cpus=max(os.cpu_count() or 1, args.workers))
        try:
            sides: dict[str, list[dict[str, Any]]] = {"fresh": [], "parked": []}
            run_once(assets, root / "prime", args.workers, reuse=True)  # leaves a parked group of this shape
            for i in range(runs):
                sides["fresh"].append(run_once(assets, root / f"fresh{i}", args.workers, reuse=False))
                run_once(assets, root / f"prime{i}", args.workers, reuse=True)  # parks again for the next side
                sides["parked"].append(run_once(assets, root / f"parked{i}", args.workers, reuse=True))
        finally:
            shutdown_ray()
    same = all(r["metrics"] == sides["fresh"][0]["metrics"] for side in sides.values() for r in side)
    wall = {name: summarize([r["wall"] for r in side])["median"] for name, side in sides.items()}
    cpu = {name: summarize([r["cpu"] for r in side])["median"] for name, side in sides.items()}
    report("RL run, parked workers vs fresh ones", wall["parked"], wall["fresh"], "s / run",
           {"workers": args.workers, "runs_per_side": runs, "cpu_s_per_run_fresh": cpu["fresh"],
            "cpu_s_per_run_parked": cpu["parked"], "same_metrics": same},
           higher_is_better=False, json_path=args.json)
    print(f"CPU seconds per run (whole machine): fresh {cpu['fresh']:.1f}, parked {cpu['parked']:.1f}")
    if not same:
        print("the two sides logged different metrics", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
