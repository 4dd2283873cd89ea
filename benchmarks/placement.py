"""PPO with the critic in its own resource pool: concurrent roles vs the same placement run phase
by phase, in the same run.

One actor worker (pool ``global_pool``: actor + rollout + reference) and one critic worker (pool
``critic_pool``), 1 CPU each, on a local Ray cluster. The run alternates steps: with
``trainer.concurrent_roles`` on, the critic's values are computed while the actor computes old and
reference log-probs, and the critic update runs beside the actor update; off, every phase waits for
the one before (what a single pool does). Same processes, same data stream, so the comparison is
not skewed by start-up or by which steps came first.

Reported: median step time of each mode (ratio > 1: the concurrent step is faster), and from the
workers' own call intervals the overlap of each phase pair: seconds both ran at once, as a fraction
of the shorter one (0 when run phase by phase).

    python benchmarks/placement.py [--quick] [--json OUT]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import arith_prompts, parse_bench_args, report, tiny_model_with_digit_reward  # noqa: E402

# Phase pairs that can overlap when the critic has its own pool: (actor methods, critic methods).
PHASES = {"forward": (("compute_log_prob", "compute_ref_log_prob"), ("compute_values",)),
          "update": (("update_actor",), ("update_critic",))}
Span = tuple[str, str, float, float]


def phase_overlap(actor: list[Span], critic: list[Span], actor_methods: tuple[str, ...],
                  critic_methods: tuple[str, ...]) -> dict[str, float]:
    """Seconds the two sides of a phase ran at the same time, and that as a fraction of the shorter
    side. Intervals within one side never overlap (one process runs one call at a time)."""
    a = [(s, e) for _, method, s, e in actor if method in actor_methods]
    c = [(s, e) for _, method, s, e in critic if method in critic_methods]
    both = sum(max(0.0, min(e1, e2) - max(s1, s2)) for s1, e1 in a for s2, e2 in c)
    shorter = min(sum(e - s for s, e in a), sum(e - s for s, e in c))
    return {"overlap_s": both, "fraction": both / shorter if shorter > 0 else 0.0}


def make_assets(root: Path, hidden: int, layers: int) -> dict[str, Path]:
    return tiny_model_with_digit_reward(root, arith_prompts(root, num_train=256), hidden, layers)


def overrides(assets: dict[str, Path], run_dir: Path, steps: int, response: int) -> list[str]:
    return [f"data.train_files=[{assets['data'] / 'train.parquet'}]", f"actor_rollout_ref.model.path={assets['model']}",
            f"trainer.run_dir={run_dir}", "data.train_batch_size=8", "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",  # two optimizer steps: old log-probs are computed
            "actor_rollout_ref.actor.use_kl_loss=true",  # reference log-probs too
            f"data.max_response_length={response}", "algorithm.adv_estimator=gae", "trainer.logger=[jsonl]",
            "trainer.val_before_train=false", f"trainer.total_training_steps={steps}", "trainer.n_gpus_per_node=1",
            "trainer.pools.critic_pool.workers_per_node=1", "trainer.placement.critic=critic_pool",
            f"custom_reward_function.path={assets['reward']}"]


def run(assets: dict[str, Path], run_dir: Path, warmup: int, pairs: int, response: int) -> list[dict[str, Any]]:
    """Steps after ``warmup``: concurrent, phase by phase, concurrent, ... (``pairs`` of each)."""
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig
    from alignctl.trainers.rl_trainer import RLTrainer

    records: list[dict[str, Any]] = []

    class AlternatingTrainer(RLTrainer):
        def train_step(self, prompts):  # type: ignore[no-untyped-def]
            concurrent = self.global_step < warmup or (self.global_step - warmup) % 2 == 0
            self.cfg.trainer.concurrent_roles = concurrent
            self.workers.spans()  # forget earlier calls (generation, the previous step)
            metrics = super().train_step(prompts)
            spans = self.workers.spans()
            if self.global_step >= warmup:
                overlap = {name: phase_overlap(spans["global_pool"], spans["critic_pool"], *methods)
                           for name, methods in PHASES.items()}
                records.append({"concurrent": concurrent, "step_s": metrics["timing_s/step"], "overlap": overlap})
            return metrics

    cfg = load_config(RLConfig, None, overrides(assets, run_dir, warmup + 2 * pairs, response))
    AlternatingTrainer(cfg).fit()
    return records


def summarize(records: list[dict[str, Any]], concurrent: bool) -> dict[str, Any]:
    rows = [r for r in records if r["concurrent"] == concurrent]
    return {"step_s": statistics.median(r["step_s"] for r in rows), "steps": len(rows),
            **{f"{phase}_overlap_fraction": statistics.median(r["overlap"][phase]["fraction"] for r in rows)
               for phase in PHASES},
            **{f"{phase}_overlap_s": statistics.median(r["overlap"][phase]["overlap_s"] for r in rows)
               for phase in PHASES}}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_bench_args(__doc__.splitlines()[0], argv)
    hidden, layers, response, pairs = (64, 2, 16, 2) if args.quick else (192, 4, 48, 6)
    with tempfile.TemporaryDirectory(prefix="bench-placement-") as tmp:
        assets = make_assets(Path(tmp), hidden, layers)
        records = run(assets, Path(tmp) / "run", warmup=2, pairs=pairs, response=response)
    together, apart = summarize(records, True), summarize(records, False)
    for name, row in (("concurrent", together), ("phase by phase", apart)):
        print(f"{name:>15}: step {row['step_s']:.3f} s (median of {row['steps']}); overlap: forward passes "
              f"{row['forward_overlap_fraction']:.0%} ({row['forward_overlap_s']:.3f} s), updates "
              f"{row['update_overlap_fraction']:.0%} ({row['update_overlap_s']:.3f} s)")
    setup = {"model": f"char Llama hidden={hidden} layers={layers}", "batch": "8 prompts x 2, response <= "
             f"{response}", "placement": "actor+rollout+ref: 1 CPU worker; critic: its own pool, 1 CPU worker",
             "concurrent": together, "phase_by_phase": apart}
    return report("PPO step, critic in its own pool: concurrent vs phase by phase", together["step_s"],
                  apart["step_s"], "s/step", setup, higher_is_better=False, json_path=args.json)


if __name__ == "__main__":
    main()
