"""Building the policy inside a worker: model, tokenizer, training engine, optimizer, reference.

Full fine-tuning keeps a frozen copy of the initial weights as the reference policy (sharded like the
actor under fsdp2 / ZeRO-3). With LoRA (``model.lora_rank > 0``) only the adapters train, so the
base weights never change: the reference is the policy module itself with its adapters switched
off, and there is no second copy of the weights.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from alignctl.config.rl import ActorConfig, ActorRolloutRefConfig, ModelConfig, OptimConfig, RLConfig
from alignctl.errors import UserError
from alignctl.models.attention import resolve_attn_implementation, resolve_packing, resolve_share_prompt
from alignctl.models.blocks import freeze_bottom_layers
from alignctl.models.compat import enable_activation_checkpointing
from alignctl.models.loading import load_causal_lm, load_tokenizer
from alignctl.rollout import RolloutSetup, engine_entry
from alignctl.workers.low_precision import low_precision_copy
from alignctl.workers.offload import ParkedModule
from alignctl.workers.strategy import build_lr_scheduler, build_optimizer, make_engine
from alignctl.workers.train_engine import TrainEngine
from alignctl.workers.worker_process import DistContext


def warmup_steps(optim: OptimConfig, total_steps: int) -> int:
    if optim.lr_warmup_steps >= 0:
        return optim.lr_warmup_steps
    return int(optim.lr_warmup_steps_ratio * total_steps)


def resolve_packing_settings(cfg: RLConfig, device: str) -> None:
    """Replace ``auto`` in the actor's and critic's ``use_remove_padding`` / ``share_prompt`` with
    this worker's choice for its device (:func:`alignctl.models.attention.resolve_packing`), once,
    before a model is loaded: every forward and the attention kernel then read plain booleans."""
    for model in (cfg.actor_rollout_ref.model, cfg.critic.model):
        model.use_remove_padding = resolve_packing(model.use_remove_padding, device=device)
        model.share_prompt = resolve_share_prompt(model.share_prompt, device=device, packing=model.use_remove_padding)


def attach_optimizer(engine: TrainEngine, model: nn.Module, optim: OptimConfig, total_steps: int) -> None:
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = build_optimizer(params, optim.lr, optim.weight_decay, optim.betas)
    scheduler = build_lr_scheduler(optimizer, total_steps=total_steps, warmup_steps=warmup_steps(optim, total_steps),
                                   style=optim.warmup_style, min_lr_ratio=optim.min_lr_ratio)
    engine.attach_optimizer(optimizer, scheduler)


@dataclass
class Policy:
    model: nn.Module  # the plain HF module (a peft model under LoRA; sharded in place under fsdp2 / ZeRO-3)
    engine: TrainEngine
    # The frozen copy wrapped like the actor; None under LoRA (adapters off instead) and when no loss term
    # reads the reference (RLConfig.needs_reference).
    ref_engine: TrainEngine | None
    tokenizer: Any
    pad_id: int
    eos_ids: list[int]
    lora: Any = None  # the peft LoraConfig when training adapters
    ref_parking: ParkedModule | None = None  # an unsharded reference kept in CPU memory between passes
    rollout_model: nn.Module | None = None  # the hf engine's own low-precision copy (rollout.dtype), else None

    @contextlib.contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The reference policy with full parameters, for no-grad forwards."""
        if self.ref_engine is None:
            if self.lora is None:
                raise RuntimeError("no reference policy was built: neither use_kl_loss nor use_kl_in_reward is on")
            with self.engine.gathered() as model, model.disable_adapter():
                yield model
            return
        parked = self.ref_parking.on_device() if self.ref_parking is not None else contextlib.nullcontext()
        with parked, self.ref_engine.gathered() as ref:
            yield ref

    def rollout_setup(self, cfg: RLConfig) -> RolloutSetup:
        """What the rollout engine is built from (rollout/registry.py: each engine reads what it needs)."""
        return RolloutSetup(
            model=self.model, model_path=str(cfg.actor_rollout_ref.model.path), pad_token_id=self.pad_id,
            eos_token_ids=list(self.eos_ids), dtype=str(next(self.model.parameters()).dtype).removeprefix("torch."),
            max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
            gather_params=self.engine.gathered, rollout_model=self.rollout_model, seed=cfg.trainer.seed)

    def rollout_weights(self) -> list[tuple[str, torch.Tensor]]:
        """The policy's complete weights under their plain HF names, for an engine holding its own copy
        (collective under sharding: every rank calls). Under LoRA the adapters are merged first, so
        the engine generates with exactly the trained policy."""
        # Not engine.full_state_dict(): under FSDP2 that fills rank 0 only, and every rank's engine needs
        # all of it. Sharded tensors are gathered one by one (every rank walks the same names in order).
        with self.engine.gathered() as model:
            state = {name: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()
                     for name, t in model.state_dict().items()}
        if self.lora is None:
            return list(state.items())
        merged = merge_lora_state(state, self.model.config, self.lora)
        return [(name, tensor.detach()) for name, tensor in merged.state_dict().items()]


def eos_ids(tokenizer: Any, model: nn.Module) -> list[int]:
    """The ids that end a response: the tokenizer's EOS and the generation config's."""
    ids = {tokenizer.eos_token_id}
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    ids |= set(gen_eos if isinstance(gen_eos, list) else [gen_eos])
    return sorted(int(i) for i in ids if i is not None)


# ---------------------------------------------------------------------------------------------- LoRA


def lora_config(model_cfg: ModelConfig) -> Any:
    """The peft config of ``model_cfg`` (no dropout: log-prob passes must be deterministic)."""
    from peft import LoraConfig

    return LoraConfig(r=model_cfg.lora_rank, lora_alpha=model_cfg.lora_alpha,
                      target_modules=list(model_cfg.target_modules), lora_dropout=0.0, bias="none",
                      task_type="CAUSAL_LM")


def check_lora_support(arr: ActorRolloutRefConfig) -> None:
    if arr.model.lora_rank <= 0:
        return
    if not engine_entry(arr.rollout.name).capabilities.lora:
        raise UserError(f"actor_rollout_ref.model.lora_rank={arr.model.lora_rank}: the rollout engine "
                        f"{arr.rollout.name!r} does not support LoRA-trained policies; use another rollout.name")
    if not arr.model.target_modules:
        raise UserError("actor_rollout_ref.model.lora_rank > 0 needs a non-empty "
                        "actor_rollout_ref.model.target_modules list (e.g. [q_proj, v_proj])")


def add_lora(model: nn.Module, config: Any) -> nn.Module:
    """``model`` wrapped with fresh adapters; only adapter weights require grad."""
    from peft import get_peft_model

    try:
        with warnings.catch_warnings():
            # peft reads transformers' deprecated ``is_gradient_checkpointing`` property; the notice
            # is meant for peft's authors and would otherwise print once from every worker.
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            return get_peft_model(model, config)
    except ValueError as exc:  # peft: target modules not found in the model
        raise UserError(f"actor_rollout_ref.model.target_modules={sorted(config.target_modules)}: {exc}") from exc


def merge_lora_state(state: dict[str, torch.Tensor], model_config: Any, config: Any) -> nn.Module:
    """A plain causal LM holding ``state`` (a peft model's full state dict) with the adapters
    merged into the base weights: W + (alpha / r) * B @ A on every adapted layer (peft's merge)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(model_config)
    peft_model = add_lora(plain, config)
    # Merging adds into the base weights in place; ``state`` may share storage with the live policy
    # (full_state_dict of an unsharded engine), so the merge works on copies.
    peft_model.load_state_dict({k: v.clone() for k, v in state.items()}, assign=True)
    return peft_model.merge_and_unload()


# ---------------------------------------------------------------------------------------------- building


def _engine_options(actor: ActorConfig) -> dict[str, Any]:
    return {"options": actor.deepspeed, "key": "actor_rollout_ref.actor.deepspeed"}


def _reference_copy(model: nn.Module, dtype: str) -> nn.Module:
    """The frozen initial weights, in CPU memory: as loaded, or a bf16 copy (``ref.dtype``)."""
    if dtype == "auto":
        return copy.deepcopy(model).eval().requires_grad_(False)
    return low_precision_copy(model, dtype, "cpu")


def _reference_engine(arr: ActorRolloutRefConfig, ref: nn.Module, ctx: DistContext
                      ) -> tuple[TrainEngine, ParkedModule | None]:
    """The frozen copy (still in CPU memory), sharded like the actor where that saves memory (fsdp2,
    ZeRO-3). ``ref.fsdp_config.param_offload`` keeps its weights in CPU memory between reference
    passes with each engine's own means: fsdp2's CPUOffloadPolicy, ZeRO-3's offload_param, and for
    an unsharded copy a :class:`ParkedModule`."""
    actor, offload = arr.actor, arr.ref.fsdp_config.param_offload
    if actor.strategy == "fsdp2":  # fully_shard places the shards on the device itself
        return make_engine("fsdp2", ref, world_size=ctx.world_size, fsdp_offload=offload), None
    if actor.strategy == "deepspeed" and actor.deepspeed.zero_stage == 3:
        options = {**_engine_options(actor), "trainable": False}
        if offload:
            options["options"] = dataclasses.replace(actor.deepspeed, offload_param=True)
        return make_engine("deepspeed", ref.to(ctx.device), world_size=ctx.world_size, **options), None
    if offload:
        parking = ParkedModule(ref, ctx.device)
        return TrainEngine(ref, ctx.world_size), parking
    return TrainEngine(ref.to(ctx.device), ctx.world_size), None


def build_policy(cfg: RLConfig, ctx: DistContext, total_steps: int) -> Policy:
    arr = cfg.actor_rollout_ref
    check_lora_support(arr)
    tokenizer = load_tokenizer(arr.model.tokenizer_path or arr.model.path, padding_side="left")
    attn = resolve_attn_implementation(arr.model.attn_implementation, device=ctx.device,
                                       packing=arr.model.use_remove_padding)
    model = load_causal_lm(arr.model.path, dtype=arr.model.dtype, attn_implementation=attn)
    if arr.model.enable_gradient_checkpointing:
        enable_activation_checkpointing(model)
        model.config.use_cache = False
    lora = lora_config(arr.model) if arr.model.lora_rank > 0 else None
    # Copied while still in CPU memory: an offloaded reference never occupies the device whole. None
    # without a KL term (no pass reads it: a whole model's memory saved).
    ref = None if lora is not None or not cfg.needs_reference else _reference_copy(model, arr.ref.dtype)
    copies = engine_entry(arr.rollout.name).capabilities.dtype_copy and arr.rollout.dtype != "auto"
    rollout_model = low_precision_copy(model, arr.rollout.dtype, ctx.device) if copies else None
    offload = arr.actor.strategy == "fsdp2" and arr.actor.fsdp_config.offload_policy
    # After the reference copy (which must not inherit it), before the engine: DDP and the optimizer
    # take only the parameters that train.
    freeze_bottom_layers(model, arr.model.freeze_layers, f"actor_rollout_ref.model.path '{arr.model.path}'",
                         key="actor_rollout_ref.model.freeze_layers")
    if ctx.device == "cuda" and not offload:  # offloaded, fully_shard moves one unit at a time
        model = model.cuda()
    if lora is not None:
        model = add_lora(model, lora)
    engine = make_engine(arr.actor.strategy, model, world_size=ctx.world_size, fsdp_offload=offload,
                         **_engine_options(arr.actor))
    attach_optimizer(engine, model, arr.actor.optim, total_steps)
    ref_engine, ref_parking = (None, None) if ref is None else _reference_engine(arr, ref, ctx)
    pad_id = int(tokenizer.pad_token_id)
    return Policy(model, engine, ref_engine, tokenizer, pad_id, eos_ids(tokenizer, model), lora, ref_parking,
                  rollout_model)


def save_hf_folder(policy: Policy, path: str, *, is_writer: bool) -> None:
    """Complete weights in HF format, written atomically by one rank (all ranks must call). Under
    LoRA the adapters are merged: the folder is a plain causal LM, no peft needed to load it."""
    from alignctl.pipeline.atomic import atomic_output_dir

    state = policy.engine.full_state_dict()
    if not is_writer:
        return
    with atomic_output_dir(path) as tmp:
        config = copy.deepcopy(policy.model.config)
        config.use_cache = True
        plain = _plain_model(state, config, policy.lora)
        plain.generation_config.eos_token_id = policy.eos_ids
        plain.generation_config.pad_token_id = policy.pad_id
        plain.save_pretrained(tmp)
        policy.tokenizer.save_pretrained(tmp)


def _plain_model(state: dict[str, torch.Tensor], config: Any, lora: Any) -> nn.Module:
    """A fresh unwrapped module holding ``state`` (FSDP2 swaps the class of the trained one)."""
    if lora is not None:
        return merge_lora_state(state, config, lora)
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config)
    plain.load_state_dict(state, assign=True)
    return plain
