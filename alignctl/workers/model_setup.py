"""Building the policy inside a worker: model, tokenizer, training engine, optimizer, reference."""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from alignctl.config.rl import OptimConfig, RLConfig, RolloutConfig
from alignctl.models.loading import load_causal_lm, load_tokenizer
from alignctl.workers.group import DistContext
from alignctl.workers.strategy import TrainEngine, build_lr_scheduler, build_optimizer, make_engine


def resolve_attn_implementation(name: str, device: str, packed: bool) -> str:
    """``auto``: the fastest exact kernel here. A dense block-diagonal mask (plain sdpa on packed
    rows) costs the square of the whole row, so packing without a varlen kernel would be slower than
    padding; the segment kernel keeps packing's advantage on CPU."""
    if name != "auto":
        return name
    if device == "cuda" and packed:
        import importlib.util

        if importlib.util.find_spec("flash_attn") is not None:
            return "flash_attention_2"
    return "alignctl_segment_sdpa" if packed else "sdpa"


def warmup_steps(optim: OptimConfig, total_steps: int) -> int:
    if optim.lr_warmup_steps >= 0:
        return optim.lr_warmup_steps
    return int(optim.lr_warmup_steps_ratio * total_steps)


def attach_optimizer(engine: TrainEngine, model: nn.Module, optim: OptimConfig, total_steps: int) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, optim.lr, optim.weight_decay, optim.betas)
    scheduler = build_lr_scheduler(optimizer, total_steps=total_steps, warmup_steps=warmup_steps(optim, total_steps),
                                   style=optim.warmup_style, min_lr_ratio=optim.min_lr_ratio)
    engine.attach_optimizer(optimizer, scheduler)


@dataclass
class Policy:
    model: nn.Module  # the plain HF module (sharded in place under fsdp2)
    engine: TrainEngine
    ref_engine: TrainEngine  # frozen copy, wrapped the same way (sharded under fsdp2)
    tokenizer: Any
    pad_id: int
    eos_ids: list[int]

    @contextlib.contextmanager
    def reference(self) -> Iterator[nn.Module]:
        with self.ref_engine.gathered() as ref:
            yield ref

    def rollout_kwargs(self, rollout: RolloutConfig) -> dict[str, Any]:
        if rollout.name == "hf":
            return {"model": self.model, "pad_token_id": self.pad_id, "eos_token_id": self.eos_ids,
                    "gather_params": self.engine.gathered}
        return {"model_path": self.model.name_or_path, "pad_token_id": self.pad_id, "eos_token_id": self.eos_ids,
                "gpu_memory_utilization": rollout.gpu_memory_utilization,
                "tensor_parallel_size": rollout.tensor_model_parallel_size, "enforce_eager": rollout.enforce_eager,
                "source_module": self.model, "gather_params": self.engine.gathered}


def _eos_ids(tokenizer: Any, model: nn.Module) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(int(i) for i in ids if i is not None)


def build_policy(cfg: RLConfig, ctx: DistContext, total_steps: int) -> Policy:
    arr = cfg.actor_rollout_ref
    tokenizer = load_tokenizer(arr.model.tokenizer_path or arr.model.path, padding_side="left")
    attn = resolve_attn_implementation(arr.model.attn_implementation, ctx.device, arr.model.use_remove_padding)
    model = load_causal_lm(arr.model.path, dtype=arr.model.dtype, attn_implementation=attn)
    if ctx.device == "cuda":
        model = model.cuda()
    if arr.model.enable_gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.config.use_cache = False
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    engine = make_engine(arr.actor.strategy, model, world_size=ctx.world_size)
    attach_optimizer(engine, model, arr.actor.optim, total_steps)
    ref_strategy = "fsdp2" if arr.actor.strategy == "fsdp2" else "none"
    ref_engine = make_engine("fsdp2", ref, world_size=ctx.world_size) if ref_strategy == "fsdp2" \
        else TrainEngine(ref, ctx.world_size)
    pad_id = int(tokenizer.pad_token_id)
    return Policy(model, engine, ref_engine, tokenizer, pad_id, _eos_ids(tokenizer, model))


def save_hf_folder(policy: Policy, path: str, *, is_writer: bool) -> None:
    """Complete weights in HF format, written atomically by one rank (all ranks must call)."""
    from alignctl.pipeline.atomic import atomic_output_dir

    state = policy.engine.full_state_dict()
    if not is_writer:
        return
    with atomic_output_dir(path) as tmp:
        model = policy.model
        config = copy.deepcopy(model.config)
        config.use_cache = True
        from transformers import AutoModelForCausalLM

        # A fresh unwrapped module (FSDP2 swaps the class of the trained one) to hold the full weights.
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(config)
        plain.load_state_dict(state, assign=True)
        plain.generation_config.eos_token_id = policy.eos_ids
        plain.generation_config.pad_token_id = policy.pad_id
        plain.save_pretrained(tmp)
        policy.tokenizer.save_pretrained(tmp)
