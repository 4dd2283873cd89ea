"""Config schema of the supervised fine-tuning stage (``alignctl sft``), run on ``trl.SFTTrainer``.

Key names follow verl's SFT trainer where one exists (``data.train_files``, ``optim.lr``,
``trainer.total_epochs``) so a verl user's overrides carry over.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from alignctl.config.core import field, section
from alignctl.errors import UserError

PRECISIONS = ("auto", "fp32", "bf16", "fp16", "bf16_if_native")
DTYPES = ("float32", "bfloat16", "float16", "auto")
SCHEDULERS = ("cosine", "linear", "constant", "constant_with_warmup")
PACKING_STRATEGIES = ("bfd", "bfd_split", "wrapped")


@dataclass
class ModelConfig:
    """Which checkpoint to start from and how to load it."""

    path: str = field("", help="Hugging Face model folder (e.g. the init-model output) or hub id. Required.")
    dtype: str = field("float32", help="Dtype the weights are loaded in (mixed precision is trainer.precision).",
                       choices=DTYPES)
    attn_implementation: str = field("auto", help="Attention kernel: 'auto' picks flash_attention_2 on a GPU "
                                                  "when packing and flash-attn is installed, else "
                                                  "alignctl_segment_sdpa when packing (packed sequences stay "
                                                  "isolated), else sdpa; or any name transformers accepts.")
    trust_remote_code: bool = field(False, help="Allow model code shipped with the checkpoint.")
    freeze_layers: int = field(0, help="Freeze the input embeddings and the first N transformer layers; only the "
                                       "layers above them and the head train. Backward stops at layer N, so a "
                                       "step costs less (a reward model on a real model on CPU). With tied "
                                       "embeddings the LM head is frozen too. 0: train everything.")


@dataclass
class SFTDataConfig:
    """Training data: parquet files of prompt/response rows."""

    train_files: list[str] = field(default_factory=list, help="Training parquet file(s). Required.")
    val_files: list[str] = field(default_factory=list, help="Held-out parquet file(s) for the eval loss "
                                                            "(none: no evaluation).")
    prompt_key: str = field("prompt", help="Prompt column: chat messages or a string; 'col.key' reads a "
                                           "field of a dict column.")
    response_key: str = field("completion", help="Response column: [{role: assistant, content}] or a string; "
                                                 "'col.key' reads a field of a dict column (GSM8K RL parquet: "
                                                 "extra_info.answer).")
    max_length: int = field(1024, help="Longest tokenized prompt+response; longer rows are truncated (and rows "
                                       "left with no response token dropped, counted). Packed row length "
                                       "when packing.")
    max_samples: int | None = field(None, help="Use at most this many training rows (quick runs).")
    apply_chat_template: bool = field(True, help="Turn string prompts/responses into chat messages so the "
                                                 "tokenizer's chat template is applied (needs one).")
    tools: list[str] = field(default_factory=list, help="Tools presented in every prompt, as the RL stage's "
                                                        "actor_rollout_ref.rollout.multi_turn.tools does; needed "
                                                        "when completions are tool-use traces (assistant calls, "
                                                        "tool messages, final answer), which are then tokenized "
                                                        "exactly as a multi-turn rollout holds them.")


@dataclass
class OptimConfig:
    """AdamW and the learning-rate schedule."""

    lr: float = field(1e-5, help="Peak learning rate.")
    warmup_ratio: float = field(0.0, help="Fraction of steps with linear warm-up.")
    lr_scheduler: str = field("cosine", help="Learning-rate schedule after warm-up.", choices=SCHEDULERS)
    weight_decay: float = field(0.0, help="AdamW weight decay.")
    clip_grad: float = field(1.0, help="Gradient-norm clipping threshold.")


@dataclass
class SFTTrainerConfig:
    """Loop length, batch shape, seeding, logging and distribution."""

    total_epochs: int = field(1, help="Passes over the training data (ignored when max_steps is set).")
    max_steps: int | None = field(None, help="Stop after this many optimizer steps.")
    micro_batch_size: int = field(4, help="Rows per device per forward/backward (packed rows when packing).")
    gradient_accumulation_steps: int = field(1, help="Micro-batches per optimizer step.")
    seed: int = field(0, help="Seed for weight init, data order and dropout: equal seeds give equal runs.")
    logging_steps: int = field(10, help="Record the train loss every N optimizer steps.")
    eval_steps: int | None = field(None, help="Also evaluate every N steps (default: before and after training).")
    precision: str = field("auto", help="Mixed precision: 'auto' = bf16 on a GPU that supports it, else fp32. "
                                        "bf16_if_native: bf16 also on a CPU with bf16 matmul instructions "
                                        "(avx512_bf16, AMX), fp32 on other CPUs, where bf16 is several times "
                                        "slower than fp32.", choices=PRECISIONS)
    gradient_checkpointing: bool = field(False, help="Recompute activations in backward to save memory.")
    deepspeed: str | None = field(None, help="DeepSpeed JSON config path, passed to the HF Trainer "
                                             "(launch with `accelerate launch` / `deepspeed` for several GPUs).")
    fsdp: str | None = field(None, help="FSDP options string passed to the HF Trainer, e.g. 'full_shard "
                                        "auto_wrap' (needs a multi-process launch).")


@dataclass
class SFTConfig:
    """Supervised fine-tuning on prompt/response pairs, loss on response tokens only."""

    model: ModelConfig = section(ModelConfig, help="Starting checkpoint.")
    data: SFTDataConfig = section(SFTDataConfig, help="Training and held-out data.")
    optim: OptimConfig = section(OptimConfig, help="Optimizer.")
    trainer: SFTTrainerConfig = section(SFTTrainerConfig, help="Training loop.")
    output_dir: str = field("runs/sft", help="Output model folder (written atomically).")
    packing: bool = field(False, help="Pack several rows into each data.max_length row (TRL best-fit "
                                      "decreasing); attention stays within each original row.")
    packing_strategy: str = field("bfd", help="TRL packing strategy.", choices=PACKING_STRATEGIES)

    def validate(self) -> None:
        if not self.model.path:
            raise UserError("sft: key 'model.path' is required (a Hugging Face model folder)")
        if not self.data.train_files:
            raise UserError("sft: key 'data.train_files' is required (one or more parquet files)")
        check_model_keys(self.model)
        check_loop_keys(self.trainer, self.data.max_length, self.optim.lr, self.optim.warmup_ratio)
        if self.data.max_samples is not None and self.data.max_samples <= 0:
            raise UserError(f"key 'data.max_samples' expected a positive integer, got {self.data.max_samples}")
        if self.data.tools:
            from alignctl.tools import TOOLS

            for name in self.data.tools:
                if name not in TOOLS:
                    raise UserError(f"key 'data.tools': unknown tool {name!r}; expected one of {', '.join(TOOLS)}")


def check_model_keys(model: ModelConfig) -> None:
    """Range checks of the model section, shared with the reward-model schema."""
    if model.freeze_layers < 0:
        raise UserError(f"key 'model.freeze_layers' expected an integer >= 0, got {model.freeze_layers}")


def check_loop_keys(trainer: SFTTrainerConfig, max_length: int | None, lr: float, warmup_ratio: float) -> None:
    """Range checks shared with the reward-model schema (same key names)."""
    positive = {"trainer.total_epochs": trainer.total_epochs, "trainer.micro_batch_size": trainer.micro_batch_size,
                "trainer.gradient_accumulation_steps": trainer.gradient_accumulation_steps,
                "trainer.logging_steps": trainer.logging_steps, "trainer.max_steps": trainer.max_steps,
                "trainer.eval_steps": trainer.eval_steps, "data.max_length": max_length}
    for key, value in positive.items():
        if value is not None and value <= 0:
            raise UserError(f"key {key!r} expected a positive integer, got {value}")
    if lr <= 0:
        raise UserError(f"key 'optim.lr' expected a positive number, got {lr}")
    if not 0.0 <= warmup_ratio < 1.0:
        raise UserError(f"key 'optim.warmup_ratio' expected a number in [0, 1), got {warmup_ratio}")
    if trainer.deepspeed is not None and not Path(trainer.deepspeed).expanduser().is_file():
        raise UserError(f"key 'trainer.deepspeed': {trainer.deepspeed} is not a file; expected a DeepSpeed JSON config")
