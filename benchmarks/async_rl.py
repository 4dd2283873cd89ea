"""Synchronous vs asynchronous RL (``trainer.async_rollout.max_staleness`` k = 0, 1, 2) in one process run:
same model, data, seed and placement (one actor worker, one rollout worker on a pool of its own).

Two settings: ``uniform`` (short answers, every batch about as long to generate as the next) and
``long_tail`` (a response budget many times the typical answer: the rare long answers set each batch's
generation time, which then varies from step to step; this is where generating ahead should pay).

Per setting and k: step throughput (steps/s after the first step, which fills the queue), the share of
the run each side waited (the trainer for a batch: ``timing_s/wait_rollout``; the rollout pool for
work: ``timing_s/wait_train``), staleness, and the mean length of generated against trained
responses (nothing is dropped, so they should agree). Printed with the ratios to k = 0, written to
``--json`` with the command, the machine and the date.

The estimate at the end is a model, not a measurement: with generation G s and the rest of a
synchronous step T s (both measured here at k = 0), a synchronous step costs G + T and a fully
overlapped one max(G, T), so async can gain at most (G + T) / max(G, T) on hardware where the two
pools do not share cores (this machine's 2 cores are shared with everything else).

``--transports`` runs every k once per ``rollout.weight_transport`` (default: collective only).

    python benchmarks/async_rl.py [--quick] [--steps N] [--smollm2 DIR] [--settings uniform long_tail]
        [--transports collective object_store] [--set KEY=VALUE ...] [--json OUT]

``--workdirs DIR ...`` runs nothing: it reads finished quickstart pipeline workdirs in which the GRPO
stage ran synchronously or with ``trainer.async_rollout.max_staleness`` (each grpo artifact with its
eval_grpo), or the output folders of ``alignctl eval --policy <grpo artifact>/actor``, and prints per seed and arm the held-out accuracy, the GRPO
stage's wall time and the mean generated against trained response length, then mean and worst per arm.
"""

from __future__ import annotations

import datetime as dt
import itertools
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import (arith_prompts, machine_info, parse_bench_args, report,  # noqa: E402
                     tiny_model_with_digit_reward)

STALENESS = (0, 1, 2)


def make_assets(root: Path, smollm2: str | None, hidden: int, layers: int) -> dict[str, Any]:
    """Arith prompts; the tiny char model with a dense digit reward, or the SmolLM2 folder with the
    arith rule score."""
    data = arith_prompts(root, num_train=512)
    if smollm2:
        return {"data": data, "model": Path(smollm2), "reward": None}
    return tiny_model_with_digit_reward(root, data, hidden, layers)


def overrides(assets: dict[str, Any], run_dir: Path, *, k: int, steps: int, response: int, batch: int,
              n: int, extra: list[str]) -> list[str]:
    reward = [f"custom_reward_function.path={assets['reward']}"] if assets["reward"] else []
    return [f"data.train_files=[{assets['data'] / 'train.parquet'}]", f"actor_rollout_ref.model.path={assets['model']}",
            f"trainer.run_dir={run_dir}", f"data.train_batch_size={batch}", f"actor_rollout_ref.rollout.n={n}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={batch}", f"data.max_response_length={response}",
            "data.max_prompt_length=192", "algorithm.adv_estimator=grpo", "trainer.logger=[jsonl]",
            "trainer.val_before_train=false", f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
            "trainer.pools.rollout_pool.workers_per_node=1", "trainer.placement.rollout=rollout_pool",
            f"trainer.async_rollout.max_staleness={k}", "monitor.baseline_prompts=0",
            "trainer.stop_on_flat_reward=false", *reward, *extra]


def run_mode(assets: dict[str, Any], run_dir: Path, **kwargs: Any) -> list[dict[str, float]]:
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig
    from alignctl.trainers.rl_trainer import RLTrainer

    RLTrainer(load_config(RLConfig, None, overrides(assets, run_dir, **kwargs))).fit()
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def summarize(rows: list[dict[str, float]]) -> dict[str, float]:
    """Everything after the first step (it fills the queue: k + 1 generations before any training)."""
    steady = rows[1:]
    total = sum(r["timing_s/step"] for r in steady)
    wait_rollout = sum(r["timing_s/wait_rollout"] for r in steady)
    return {"steps_per_s": len(steady) / total, "step_s_median": statistics.median(r["timing_s/step"] for r in steady),
            "trainer_wait_share": wait_rollout / total,
            "rollout_wait_share": sum(r["timing_s/wait_train"] for r in steady) / total,
            # generation and everything else of a step, as the synchronous loop shows them
            "gen_s_median": statistics.median(r["timing_s/wait_rollout"] for r in steady),
            "rest_s_median": statistics.median(r["timing_s/step"] - r["timing_s/wait_rollout"] for r in steady),
            "staleness_mean": statistics.fmean(r["rollout/staleness/mean"] for r in steady),
            "weight_sync_s_median": statistics.median(r.get("timing_s/rollout_weight_sync", 0.0) for r in steady),
            "staleness_max": max(r["rollout/staleness/max"] for r in rows),
            "generated_length_mean": statistics.fmean(r["rollout/generated_length/mean"] for r in rows),
            "trained_length_mean": statistics.fmean(r["rollout/trained_length/mean"] for r in rows),
            "response_length_max": max(r["response_length/max"] for r in rows),
            "score_mean": statistics.fmean(r["critic/score/mean"] for r in rows)}


def estimate(sync: dict[str, float]) -> dict[str, float]:
    """The overlap model's bound from the synchronous run's phase times (an estimate, not a measurement)."""
    g, t = sync["gen_s_median"], sync["rest_s_median"]
    return {"gen_s": g, "rest_s": t, "sync_step_s": g + t, "async_step_s": max(g, t),
            "max_speedup": (g + t) / max(g, t)}


def print_setting(name: str, results: dict[int, dict[str, float]]) -> None:
    base = results[0]["steps_per_s"]
    print(f"\n{name}:")
    print(f"{'k':>3} {'steps/s':>8} {'vs k=0':>7} {'trainer waits':>14} {'rollout waits':>14} {'staleness':>10} "
          f"{'gen len':>8} {'trained len':>11}")
    for k, r in results.items():
        print(f"{k:>3} {r['steps_per_s']:>8.3f} {r['steps_per_s'] / base:>6.2f}x {r['trainer_wait_share']:>14.0%} "
              f"{r['rollout_wait_share']:>14.0%} {r['staleness_mean']:>10.2f} {r['generated_length_mean']:>8.2f} "
              f"{r['trained_length_mean']:>11.2f}")
    est = estimate(results[0])
    print(f"estimate (overlap model, not measured): generation {est['gen_s']:.3f} s + rest {est['rest_s']:.3f} s per "
          f"synchronous step -> at most {est['max_speedup']:.2f}x with both pools on hardware of their own")


def evaluations(folder: Path) -> list[tuple[dict[str, Any], Path]]:
    """(eval manifest, the GRPO artifact it evaluated) for every eval_grpo stage of a pipeline workdir,
    or for ``folder`` itself when it is the output of ``alignctl eval --policy <grpo>/actor``."""
    own = folder / "manifest.json"
    if own.exists() and json.loads(own.read_text()).get("stage") == "eval":
        evaluation = json.loads(own.read_text())
        return [(evaluation, Path(evaluation["inputs"]["policy"]).parent)]
    return [(evaluation, Path(evaluation["inputs"]["grpo"]))
            for evaluation in (json.loads(p.read_text()) for p in sorted(folder.glob("eval_grpo-*/manifest.json")))]


def grpo_arms(workdir: Path) -> list[dict[str, Any]]:
    """Every evaluation of a GRPO run in ``workdir`` (see :func:`evaluations`) with that run's
    staleness bound, accuracy, wall time and lengths."""
    arms = []
    for evaluation, grpo in evaluations(workdir):
        manifest = json.loads((grpo / "manifest.json").read_text())
        trainer = manifest["config"].get("trainer", {})
        rows = [json.loads(line) for line in (grpo / "metrics.jsonl").read_text().splitlines()]
        rows = [r for r in rows if "rollout/trained_length/mean" in r]
        arms.append({"workdir": str(workdir), "grpo": grpo.name,
                     "max_staleness": trainer.get("async_rollout", {}).get("max_staleness", 0),
                     "accuracy": evaluation["metrics"]["accuracy/arith/pass@1"],
                     "sft_accuracy": evaluation["metrics"]["reference_accuracy/arith/pass@1"],
                     "grpo_wall_s": round(manifest["wall_time_s"]),
                     "generated_length": statistics.fmean(r["rollout/generated_length/mean"] for r in rows) if rows else None,
                     "trained_length": statistics.fmean(r["rollout/trained_length/mean"] for r in rows) if rows else None})
    return arms


def summarize_workdirs(workdirs: list[str], json_path: str | None) -> dict[str, Any]:
    arms = [arm for folder in workdirs for arm in grpo_arms(Path(folder))]
    for arm in arms:
        print(json.dumps(arm))
    summary: dict[str, Any] = {}
    for k in sorted({a["max_staleness"] for a in arms}):
        mine = [a for a in arms if a["max_staleness"] == k]
        summary[f"k={k}"] = {"runs": len(mine), "accuracy_mean": statistics.fmean(a["accuracy"] for a in mine),
                             "accuracy_worst": min(a["accuracy"] for a in mine),
                             "grpo_wall_s_mean": statistics.fmean(a["grpo_wall_s"] for a in mine)}
    print(json.dumps(summary))
    record = {"name": "async_rl_quickstart", "command": " ".join(["python", *sys.argv]), "arms": arms,
              "summary": summary, "machine": machine_info(), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    if json_path:
        Path(json_path).write_text(json.dumps(record, indent=2) + "\n")
    return record


def main(argv: list[str] | None = None) -> dict[str, Any]:
    def extra(parser: Any) -> None:
        parser.add_argument("--steps", type=int, default=None, help="steps per run (default 10; 3 with --quick)")
        parser.add_argument("--smollm2", default=None, metavar="DIR", help="a Hugging Face model folder "
                            "(SmolLM2-135M-Instruct) instead of the tiny random model")
        parser.add_argument("--settings", nargs="+", choices=("uniform", "long_tail"), default=["uniform", "long_tail"])
        parser.add_argument("--workdirs", nargs="+", default=None, metavar="DIR",
                            help="summarize finished quickstart workdirs (sync and async GRPO arms); run nothing")
        parser.add_argument("--transports", nargs="+", choices=("collective", "object_store"), default=["collective"],
                            help="rollout.weight_transport values to run, each with every k")
        parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                            help="more config overrides for every run (e.g. actor_rollout_ref.rollout.weight_transport=object_store)")

    args = parse_bench_args(__doc__.splitlines()[0], argv, extra)
    if args.workdirs:
        return summarize_workdirs(args.workdirs, args.json)
    steps = args.steps or (3 if args.quick else 10)
    hidden, layers = (64, 2) if args.quick else (256, 4)
    short = 40 if args.smollm2 else 16
    settings = {name: budget for name, budget in (("uniform", short), ("long_tail", 8 * short)) if name in args.settings}
    batch, n = (4, 2) if args.quick else (8, 4)
    results: dict[str, dict[int, dict[str, float]]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-async-") as tmp:
        assets = make_assets(Path(tmp), args.smollm2, hidden, layers)
        for (setting, response), transport in itertools.product(settings.items(), args.transports):
            name = setting if len(args.transports) == 1 else f"{setting}, {transport}"
            results[name] = {}
            for k in STALENESS:
                rows = run_mode(assets, Path(tmp) / f"{setting}-{transport}-k{k}", k=k, steps=steps,
                                response=response, batch=batch, n=n,
                                extra=[f"actor_rollout_ref.rollout.weight_transport={transport}", *args.set])
                results[name][k] = summarize(rows)
            print_setting(f"{name} (max_response_length {response})", results[name])
    import ray

    ray.shutdown()
    headline = next((v for name, v in results.items() if name.startswith("long_tail")), next(iter(results.values())))
    setup = {"command": " ".join(["python", *sys.argv]), "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
             "model": args.smollm2 or f"tiny char Llama hidden={hidden} layers={layers} (random weights)",
             "batch": f"{batch} prompts x {n}", "steps_per_run": steps,
             "placement": "actor: 1 CPU worker; rollout: its own pool, 1 CPU worker (hf engine)", "overrides": args.set,
             "settings": {name: {"max_response_length": settings[name.split(",")[0]], "by_staleness": {str(k): r for k, r in v.items()},
                                 "estimate": estimate(v[0])} for name, v in results.items()}}
    return report(f"async RL, {'long-tail' if 'long_tail' in results else 'uniform'} setting: k=1 vs synchronous "
                  "(k=0)", headline[1]["steps_per_s"], headline[0]["steps_per_s"], "steps/s", setup, higher_is_better=True, json_path=args.json)


if __name__ == "__main__":
    main()
