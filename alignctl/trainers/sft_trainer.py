"""``alignctl sft``: supervised fine-tuning on prompt/response pairs, on ``trl.SFTTrainer``.

TRL does the work: chat-template rendering, completion-only labels (prompt tokens get -100),
truncation, best-fit-decreasing packing, the training loop. This module maps alignctl's config
onto it, reads and checks the data with one-line errors, measures the loss before and after, and
writes the result as a Hugging Face model folder artifact (model + tokenizer + manifest.json).

Multi-GPU: launch the same command under ``accelerate launch`` or ``torchrun``; the HF Trainer
picks up the process group, and ``trainer.deepspeed`` / ``trainer.fsdp`` pass through to it. On
CPU it is one process.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from alignctl.config.core import to_dict
from alignctl.config.sft import SFTConfig
from alignctl.device import resolve_device
from alignctl.errors import UserError
from alignctl.trainers import sft_common as common
from alignctl.trainers.sft_data import has_tool_traces, to_prompt_completion, to_trace_ids

if TYPE_CHECKING:
    import datasets

STAGE = "sft"


@dataclass
class SFTResult:
    """What ``run_sft`` produced: the model folder and its headline metrics (also in the manifest)."""

    output_dir: Path
    metrics: dict[str, float]
    wall_time_s: float
    dropped: dict[str, int] = field(default_factory=dict)


def load_sft_split(files: list[str], key: str, cfg: SFTConfig, tokenizer: Any) -> datasets.Dataset:
    """Read parquet ``files`` (config key ``key``) into prompt/completion rows."""
    raw = common.read_parquet_files(files, key, "SFT rows (prompt and response)")
    if has_tool_traces(raw, cfg.data.response_key):
        return _trace_split(raw, files, cfg, tokenizer)
    chat = cfg.data.apply_chat_template
    ds = to_prompt_completion(raw, cfg.data.prompt_key, cfg.data.response_key, chat=chat, where=", ".join(files))
    if chat and not getattr(tokenizer, "chat_template", None):
        raise UserError(f"model.path '{cfg.model.path}': tokenizer has no chat template; set "
                        "data.apply_chat_template=false to train on plain-text rows")
    return ds


def _trace_split(raw: datasets.Dataset, files: list[str], cfg: SFTConfig, tokenizer: Any) -> datasets.Dataset:
    """Tool-use traces, tokenized as the multi-turn rollout holds them (data.tools in every prompt)."""
    from alignctl.tools import tool_schemas

    where = ", ".join(files)
    if not cfg.data.tools:
        raise UserError(f"{where}: the completions are tool-use traces; set data.tools to the tools the prompts "
                        f"offer (the RL stage's actor_rollout_ref.rollout.multi_turn.tools, e.g. [calculator])")
    if not cfg.data.apply_chat_template or not getattr(tokenizer, "chat_template", None):
        raise UserError(f"{where}: tool-use traces need the model's chat template (data.apply_chat_template=true and "
                        f"a tokenizer with one)")
    return to_trace_ids(raw, cfg.data.prompt_key, cfg.data.response_key, tokenizer, tool_schemas(cfg.data.tools),
                        where=where)


def build_sft_trainer(cfg: SFTConfig, tokenizer: Any, train: datasets.Dataset, val: datasets.Dataset | None,
                      *, progress: bool) -> Any:
    """A ``trl.SFTTrainer`` configured from ``cfg`` (loss on completion tokens only)."""
    import trl

    from alignctl.models.attention import resolve_attn_implementation

    attn = resolve_attn_implementation(cfg.model.attn_implementation, device=resolve_device(), packing=cfg.packing)
    kwargs = common.training_kwargs(cfg, common.staging_dir(cfg.output_dir), has_eval=val is not None,
                                    max_length=cfg.data.max_length, attn_implementation=attn)
    args = trl.SFTConfig(**kwargs, completion_only_loss=True, packing=cfg.packing,
                         packing_strategy=cfg.packing_strategy)
    trainer = common.make_trainer(
        lambda: trl.SFTTrainer(model=cfg.model.path, args=args, train_dataset=train, eval_dataset=val,
                               processing_class=tokenizer,
                               callbacks=[common.progress_callback(progress, "sft")]),
        f"sft: model.path '{cfg.model.path}'")
    common.drop_printer_callback(trainer)
    from alignctl.models.blocks import freeze_bottom_layers
    from alignctl.trainers.sft_head import use_label_positions_head

    use_label_positions_head(trainer.model)  # off CUDA, TRL's fused head projects every position
    freeze_bottom_layers(trainer.model, cfg.model.freeze_layers, f"sft: model.path '{cfg.model.path}'")
    return trainer


def _train_and_measure(trainer: Any, has_val: bool) -> dict[str, float]:
    """Train; the eval loss is measured before and after so the manifest shows the change."""
    metrics: dict[str, float] = {}
    if has_val:
        metrics["val/loss_start"] = float(trainer.evaluate()["eval_loss"])
    start = time.perf_counter()
    out = trainer.train()
    metrics["timing_s/train"] = time.perf_counter() - start
    losses = common.logged_series(trainer.state.log_history, "loss")
    if losses:
        metrics["train/loss_start"], metrics["train/loss_end"] = losses[0], losses[-1]
    metrics["train/loss_mean"] = float(out.training_loss)
    metrics["train/steps"] = float(trainer.state.global_step)
    metrics["train/processes"] = float(trainer.args.world_size)
    metrics["train/bf16"] = float(trainer.args.bf16)  # which one trainer.precision resolved to
    if has_val:
        final = trainer.evaluate()
        metrics["val/loss"] = float(final["eval_loss"])
        if "eval_mean_token_accuracy" in final:
            metrics["val/mean_token_accuracy"] = float(final["eval_mean_token_accuracy"])
    return metrics


def _dropped(trainer: Any, train: datasets.Dataset, val: datasets.Dataset | None, cfg: SFTConfig) -> dict[str, int]:
    """Rows TRL dropped because truncation to max_length left no completion token. Packed
    datasets have a different row count by design, so nothing is counted there."""
    if cfg.packing:
        return {}
    dropped = {"train": len(train) - len(trainer.train_dataset)}
    if val is not None:
        dropped["val"] = len(val) - len(trainer.eval_dataset)
    if len(trainer.train_dataset) == 0:
        raise UserError(f"sft: all {len(train)} training rows lose their whole response at "
                        f"data.max_length={cfg.data.max_length} tokens; raise data.max_length")
    return dropped


def run_sft(cfg: SFTConfig, *, progress: bool = True) -> SFTResult:
    """Run the SFT stage described by ``cfg``; writes ``cfg.output_dir`` atomically."""
    start = time.perf_counter()
    try:
        with common.quiet_libraries():
            common.check_model_folder(cfg.model.path)
            tokenizer = common.load_tokenizer_for_training(cfg.model.path, cfg.model.trust_remote_code)
            train = load_sft_split(cfg.data.train_files, "data.train_files", cfg, tokenizer)
            train = common.take(train, cfg.data.max_samples)
            val = load_sft_split(cfg.data.val_files, "data.val_files", cfg, tokenizer) if cfg.data.val_files else None
            trainer = build_sft_trainer(cfg, tokenizer, train, val, progress=progress)
            dropped = _dropped(trainer, train, val, cfg)
            metrics = _train_and_measure(trainer, val is not None)
            metrics["train/rows"] = float(len(train))
            metrics.update({f"{split}/dropped_rows": float(n) for split, n in dropped.items()})
            finish = _manifest_writer(cfg, metrics, start)
            out = common.save_artifact(trainer, cfg.output_dir, finish)
    finally:
        common.remove_staging(cfg.output_dir)
    return SFTResult(output_dir=out, metrics=metrics, wall_time_s=time.perf_counter() - start, dropped=dropped)


def _manifest_writer(cfg: SFTConfig, metrics: dict[str, float], start: float) -> Any:
    from alignctl.pipeline.manifest import write_manifest

    def finish(folder: Path) -> None:
        write_manifest(folder, stage=STAGE, config=to_dict(cfg), inputs=common.manifest_inputs(cfg), metrics=metrics,
                       wall_time_s=time.perf_counter() - start)

    return finish


def print_sft_report(result: SFTResult) -> None:
    """Headline metrics as a table (the CLI calls this after :func:`run_sft`)."""
    from alignctl.console import print_table

    rows = [[k, f"{v:.4f}" if isinstance(v, float) and not v.is_integer() else int(v)]
            for k, v in result.metrics.items()]
    print_table(f"sft -> {result.output_dir}", ["metric", "value"], rows)
