"""GRPO seconds per step: alignctl (Ray workers, hybrid engine) vs TRL ``GRPOTrainer``.

Both run in this one process, one after the other, on the same work:

* the same model folder: a ~5.2M-parameter Llama from ``alignctl.models.tiny.init_model`` with a
  byte-level BPE tokenizer trained on GSM8K text (hidden 256, 4 layers, 4 heads, vocab 2000);
* the same prompts in the same order: GSM8K (../shared/data/gsm8k) through ``alignctl preprocess``,
  chat-formatted by the tokenizer's template, no shuffling on either side;
* 8 prompts x n=4 samples per step, at most 64 new tokens, temperature 1.0, stop at EOS;
* the same loss family: token-mean PPO-clip (eps 0.2) + beta * k3 KL to the frozen reference
  (alignctl ``use_kl_loss`` / ``low_var_kl``; TRL ``beta`` with ``loss_type="dapo"``), group-std
  normalised advantages, one AdamW step per batch (same lr, no weight decay, grad clip 1.0),
  float32, no gradient checkpointing;
* the same reward function object (:func:`score_response`): the GSM8K rule scorer plus a dense
  digit-fraction term, so an untrained model still gets non-zero advantages and real backward passes;
* the same compute: one torch thread in TRL's process and in each alignctl worker. The headline row
  is alignctl with 1 worker (1 process, 1 thread, like TRL) and its segment-by-segment packed
  attention (``attn_implementation=alignctl_segment_sdpa``); a row with the default dense-mask
  ``sdpa`` follows, then 2 workers, which use two cores and show data-parallel scaling.

Per step each side does: generation, reward, reference forward, one forward + backward + optimizer
step. alignctl additionally recomputes the "old" log-probs (a no-grad forward over the batch; TRL
skips it when generation and optimizer steps are aligned): it does strictly more model work per step.

Seconds per step = wall time between the ends of consecutive steps after ``warmup_steps`` steps
(TRL: a ``TrainerCallback.on_step_end`` clock; alignctl: a ``train_step`` override), median over the
measured steps. ratio = TRL s/step / alignctl s/step, so > 1 means alignctl is faster.

Run: ``python benchmarks/grpo_vs_trl.py [--quick] [--json out.json]`` (full: a few minutes on 2 cores;
the numbers are only as quiet as the machine).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

# Heavy imports (torch, alignctl, trl) stay inside functions: alignctl's reward loader imports this
# very file for ``bench_reward``, and should not pay for them.
sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import parse_bench_args, report, summarize  # noqa: E402

GSM8K_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "gsm8k"
# The dense auxiliary term: up to 0.5 for an all-digit answer, below the 1.0 of a correct one.
AUX_WEIGHT = 0.5
# Torch threads of each side's training process: alignctl's default (trainer.cpus_per_worker=1) and
# the same for TRL. Equal threads matter: on a loaded 2-core machine a 2-thread process was measured
# 10-20x slower per step than a 1-thread one (OpenMP barriers stall when a core is stolen).
THREADS_PER_PROCESS = 1


@dataclass(frozen=True)
class OursRow:
    """One alignctl configuration to time: worker processes and the packed-attention kernel."""

    workers: int
    attn: str  # actor_rollout_ref.model.attn_implementation

    @property
    def name(self) -> str:
        return f"alignctl {self.workers} worker{'s' if self.workers > 1 else ''}, {self.attn}"


# alignctl_segment_sdpa runs packed sequences segment by segment (cost sum(len^2)); the default
# sdpa gets a dense block-diagonal mask over packed rows of up to max_packed_row_tokens tokens.
SEGMENT = OursRow(1, "alignctl_segment_sdpa")


@dataclass(frozen=True)
class Workload:
    hidden: int
    layers: int
    heads: int
    intermediate: int
    vocab: int
    data_rows: int  # GSM8K rows preprocessed (tokenizer training text and prompt pool)
    prompts: int  # prompts per step
    n: int  # samples per prompt
    max_new_tokens: int
    warmup_steps: int
    measured_steps: int
    ours_rows: tuple[OursRow, ...]  # the first is the headline ("ours" in the JSON record)
    beta: float = 0.04
    lr: float = 1e-5
    temperature: float = 1.0
    clip: float = 0.2
    seed: int = 1

    @property
    def total_steps(self) -> int:
        return self.warmup_steps + self.measured_steps


FULL = Workload(256, 4, 4, 1024, 2000, data_rows=512, prompts=8, n=4, max_new_tokens=64,
                warmup_steps=1, measured_steps=6,
                ours_rows=(SEGMENT, OursRow(1, "sdpa"), OursRow(2, "alignctl_segment_sdpa")))
QUICK = Workload(64, 2, 4, 128, 400, data_rows=64, prompts=4, n=2, max_new_tokens=16,
                 warmup_steps=1, measured_steps=1, ours_rows=(SEGMENT,))


@dataclass
class SideResult:
    """One measured row: seconds of each measured step and what the side generated."""

    name: str
    step_seconds: list[float]
    mean_response_length: float  # tokens per response incl. EOS, mean over every step
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def s_per_step(self) -> float:
        return statistics.median(self.step_seconds)


# ---------------------------------------------------------------------------------------------
# The reward: one Python function, called through each library's own reward interface


def digit_fraction(text: str) -> float:
    return sum(ch.isdigit() for ch in text) / len(text) if text else 0.0


def score_response(text: str, ground_truth: str) -> float:
    """GSM8K strict rule score (1 correct, 0 otherwise) + AUX_WEIGHT * digit fraction."""
    from alignctl.rewards.gsm8k import compute_score

    return compute_score(text, str(ground_truth)) + AUX_WEIGHT * digit_fraction(text)


def bench_reward(data_source: str, solution_str: str, ground_truth: str, extra_info: Any = None) -> float:
    """alignctl / verl custom-reward signature (``custom_reward_function.name=bench_reward``)."""
    del data_source, extra_info
    return score_response(solution_str, ground_truth)


def trl_reward(prompts: list[Any], completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
    """TRL reward-function signature; conversational completions are ``[{role, content}]``."""
    texts = [c[0]["content"] if isinstance(c, list) else c for c in completions]
    return [score_response(t, gt) for t, gt in zip(texts, ground_truth, strict=True)]


# ---------------------------------------------------------------------------------------------
# Shared assets: prompts parquet and the tiny model folder


@dataclass(frozen=True)
class Assets:
    train: Path  # GSM8K RL prompt parquet (verl schema)
    model: Path  # HF folder: tiny Llama + BPE tokenizer with chat template
    num_parameters: int


def build_assets(root: Path, w: Workload) -> Assets:
    from alignctl.config.preprocess import PreprocessConfig
    from alignctl.data.preprocess import run_preprocess
    from alignctl.models.tiny import init_model

    data = root / "gsm8k"
    run_preprocess(PreprocessConfig(dataset="gsm8k", input=str(GSM8K_DIR), out=str(data), max_rows=w.data_rows),
                   progress=False)
    model = root / "model"
    info = init_model(out=model, tokenizer_from=[data / "train.parquet"], hidden=w.hidden, layers=w.layers,
                      heads=w.heads, intermediate=w.intermediate, vocab_size=w.vocab, tokenizer_kind="bpe", seed=0)
    return Assets(data / "train.parquet", model, info.num_parameters)


# ---------------------------------------------------------------------------------------------
# alignctl side


def alignctl_overrides(w: Workload, assets: Assets, run_dir: Path, row: OursRow) -> list[str]:
    """Dotted overrides (verl key names) matching :func:`trl_args` term for term."""
    return [
        f"data.train_files=[{assets.train}]", "data.shuffle=false", "data.max_prompt_length=1024",
        f"data.train_batch_size={w.prompts}", f"data.max_response_length={w.max_new_tokens}",
        f"actor_rollout_ref.model.path={assets.model}", f"actor_rollout_ref.model.attn_implementation={row.attn}",
        f"actor_rollout_ref.rollout.n={w.n}", f"actor_rollout_ref.rollout.temperature={w.temperature}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={w.prompts}", "actor_rollout_ref.actor.ppo_epochs=1",
        "actor_rollout_ref.actor.use_kl_loss=true", f"actor_rollout_ref.actor.kl_loss_coef={w.beta}",
        "actor_rollout_ref.actor.kl_loss_type=low_var_kl", "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.actor.clip_ratio={w.clip}", "actor_rollout_ref.actor.grad_clip=1.0",
        f"actor_rollout_ref.actor.optim.lr={w.lr}", "actor_rollout_ref.actor.optim.weight_decay=0.0",
        "algorithm.adv_estimator=grpo", "algorithm.norm_adv_by_std_in_grpo=true",
        f"custom_reward_function.path={Path(__file__).resolve()}", "custom_reward_function.name=bench_reward",
        f"trainer.total_training_steps={w.total_steps}", f"trainer.n_gpus_per_node={row.workers}",
        f"trainer.cpus_per_worker={THREADS_PER_PROCESS}", "trainer.device=cpu", f"trainer.seed={w.seed}",
        "trainer.logger=[jsonl]", "trainer.val_before_train=false", f"trainer.run_dir={run_dir}",
    ]


def step_intervals(step_ends: list[float], warmup_steps: int) -> list[float]:
    """Durations of the steps after the first ``warmup_steps``, from their end timestamps.

    Step k (1-based) lasted ends[k-1] - ends[k-2]; the first measured step is warmup_steps + 1."""
    if warmup_steps < 1:
        raise ValueError("need at least one warm-up step: a step's start is the previous step's end")
    return [b - a for a, b in zip(step_ends[warmup_steps - 1:], step_ends[warmup_steps:])]


def run_alignctl(w: Workload, assets: Assets, run_dir: Path, row: OursRow) -> SideResult:
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig
    from alignctl.trainers.rl_trainer import RLTrainer

    class ClockedTrainer(RLTrainer):
        """Stamps the end of every step (the documented way to customise: override a hook)."""

        def __init__(self, cfg: RLConfig) -> None:
            super().__init__(cfg)
            self.step_ends: list[float] = []

        def train_step(self, prompts: Any) -> dict[str, float]:
            metrics = super().train_step(prompts)
            self.step_ends.append(time.perf_counter())
            return metrics

    cfg = load_config(RLConfig, None, alignctl_overrides(w, assets, run_dir, row))
    trainer = ClockedTrainer(cfg)
    result = trainer.fit()
    measured = result.history[w.warmup_steps:]
    breakdown = {k: statistics.fmean(m[k] for m in measured) for k in measured[0] if k.startswith("timing_s/")}
    return SideResult(
        name=row.name,
        step_seconds=step_intervals(trainer.step_ends, w.warmup_steps),
        mean_response_length=statistics.fmean(m["response_length/mean"] for m in result.history),
        details={"workers": row.workers, "attn_implementation": row.attn, "torch_threads": cfg.trainer.cpus_per_worker,
                 "timing_s_mean": breakdown, "grad_norm_mean": statistics.fmean(m["actor/grad_norm"] for m in measured),
                 "prompt_length_mean": statistics.fmean(m["prompt_length/mean"] for m in result.history),
                 "score_mean": statistics.fmean(m["critic/score/mean"] for m in result.history),
                 "includes": "generate, reward (background thread), old log-prob fwd, ref fwd, "
                             "advantage, actor fwd+bwd+AdamW"},
    )


# ---------------------------------------------------------------------------------------------
# TRL side


def trl_dataset(parquet: Path) -> Any:
    """The same rows, in file order: conversational ``prompt`` + a ``ground_truth`` column."""
    import datasets
    import pyarrow.parquet as pq

    table = pq.read_table(parquet, columns=["prompt", "reward_model"]).to_pylist()
    return datasets.Dataset.from_list(
        [{"prompt": row["prompt"], "ground_truth": row["reward_model"]["ground_truth"]} for row in table])


def trl_args(w: Workload, out_dir: Path) -> Any:
    from trl import GRPOConfig

    return GRPOConfig(
        output_dir=str(out_dir), report_to="none", save_strategy="no", logging_steps=1, disable_tqdm=True,
        use_cpu=True, bf16=False, activation_checkpointing=False, use_vllm=False, seed=w.seed,
        per_device_train_batch_size=w.prompts * w.n, gradient_accumulation_steps=1, steps_per_generation=1,
        num_generations=w.n, max_completion_length=w.max_new_tokens, temperature=w.temperature,
        beta=w.beta, loss_type="dapo", epsilon=w.clip, scale_rewards="group", num_iterations=1,
        learning_rate=w.lr, weight_decay=0.0, max_grad_norm=1.0, lr_scheduler_type="constant", warmup_steps=0,
        max_steps=w.total_steps, shuffle_dataset=False, dataloader_num_workers=0,
    )


def run_trl(w: Workload, assets: Assets, out_dir: Path) -> SideResult:
    import torch
    from transformers import AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback
    from trl import GRPOTrainer

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.step_ends: list[float] = []
            self.logs: list[dict[str, float]] = []

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.step_ends.append(time.perf_counter())

        def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any) -> None:
            if logs and "completions/mean_length" in logs:
                self.logs.append(dict(logs))

    clock = StepClock()
    tokenizer = AutoTokenizer.from_pretrained(assets.model, padding_side="left")
    trainer = GRPOTrainer(model=str(assets.model), reward_funcs=trl_reward, args=trl_args(w, out_dir),
                          train_dataset=trl_dataset(assets.train), processing_class=tokenizer, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # a dict per step on stdout; the table says it all
    threads = torch.get_num_threads()
    torch.set_num_threads(THREADS_PER_PROCESS)
    try:
        trainer.train()
    finally:
        torch.set_num_threads(threads)
    measured = clock.logs[w.warmup_steps:]
    return SideResult(
        name=f"TRL {_version('trl')} GRPOTrainer",
        step_seconds=step_intervals(clock.step_ends, w.warmup_steps),
        mean_response_length=statistics.fmean(row["completions/mean_length"] for row in clock.logs),
        details={"torch_threads": THREADS_PER_PROCESS,
                 "grad_norm_mean": statistics.fmean(row.get("grad_norm", float("nan")) for row in measured),
                 "score_mean": statistics.fmean(row["reward"] for row in clock.logs),
                 "includes": "generate (model.generate), reward, ref fwd, policy fwd+bwd+AdamW, logging"},
    )


def _version(package: str) -> str:
    from importlib.metadata import version

    return version(package)


# ---------------------------------------------------------------------------------------------
# Driver


def _print_rows(baseline: SideResult, ours: list[SideResult]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="GRPO step time (median s/step; ratio = TRL / row, > 1 = faster than TRL)")
    for column in ("side", "s/step", "min..max", "mean resp. tokens", "ratio"):
        table.add_column(column, justify="left" if column == "side" else "right")
    for row in (baseline, *ours):
        table.add_row(row.name, f"{row.s_per_step:.3f}", f"{min(row.step_seconds):.2f}..{max(row.step_seconds):.2f}",
                      f"{row.mean_response_length:.1f}", f"{baseline.s_per_step / row.s_per_step:.2f}x")
    console = Console()
    console.print(table)
    for row in (baseline, *ours):
        console.print(f"{row.name}: {row.details['includes']}")
    for row in ours:
        parts = ", ".join(f"{k.removeprefix('timing_s/')}={v:.3f}" for k, v in row.details["timing_s_mean"].items())
        console.print(f"{row.name} timing_s (mean of measured steps): {parts}")


def run_benchmark(w: Workload, root: Path) -> tuple[SideResult, list[SideResult], Assets]:
    """TRL first (no Ray processes running beside it), then one alignctl run per worker count."""
    import ray

    assets = build_assets(root, w)
    baseline = run_trl(w, assets, root / "trl")
    ours = [run_alignctl(w, assets, root / f"alignctl-{i}", row) for i, row in enumerate(w.ours_rows)]
    if ray.is_initialized():
        ray.shutdown()
    return baseline, ours, assets


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_bench_args(__doc__.splitlines()[0], argv)
    w = QUICK if args.quick else FULL
    with tempfile.TemporaryDirectory(prefix="grpo_vs_trl-") as tmp:
        baseline, ours, assets = run_benchmark(w, Path(tmp))
    _print_rows(baseline, ours)
    setup: dict[str, Any] = {
        "workload": asdict(w), "model_parameters": assets.num_parameters,
        "prompts_per_step": w.prompts, "n": w.n, "max_new_tokens": w.max_new_tokens,
        "responses_per_step": w.prompts * w.n, "trl_version": _version("trl"),
        "sides": {row.name: {"s_per_step": row.s_per_step, "step_seconds": row.step_seconds,
                             "summary": summarize(row.step_seconds),
                             "mean_response_length": row.mean_response_length, **row.details}
                  for row in (baseline, *ours)},
        "ratios": {row.name: baseline.s_per_step / row.s_per_step for row in ours},
    }
    return report("grpo_vs_trl", ours=ours[0].s_per_step, baseline=baseline.s_per_step, unit="s/step",
                  setup=setup, higher_is_better=False, json_path=args.json)


if __name__ == "__main__":
    main()
