"""``alignctl plan``: an RL config -> each role's memory per device, before any weights load.

Model shapes come from each folder's ``config.json`` (the parameter count from an empty model built
on the ``meta`` device, so any architecture transformers knows is counted exactly); the formulas
are in :mod:`alignctl.plan.memory`."""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from alignctl.config.rl import RLConfig
from alignctl.device import resolve_device
from alignctl.errors import UserError
from alignctl.plan import memory as mem

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


@dataclass
class Plan:
    roles: list[mem.RoleMemory]
    peak: int
    peak_phase: str
    device_memory: int | None  # bytes available per device (None: unknown)
    device: str
    world: int

    @property
    def fits(self) -> bool:
        return self.device_memory is None or self.peak <= self.device_memory


def model_shape(path: str, head: str) -> mem.ModelShape:
    """Shape of the model in ``path`` with a ``head`` ("lm", "value" or "score") from config.json."""
    import torch
    from transformers import AutoConfig, AutoModel

    try:
        config = AutoConfig.from_pretrained(path)
    except (OSError, ValueError) as exc:
        raise UserError(f"plan: cannot read the model config in {path}: {str(exc).splitlines()[0]}") from None
    text = config.get_text_config()
    with torch.device("meta"):
        trunk = AutoModel.from_config(config)
    params = sum(p.numel() for p in trunk.parameters())
    hidden = int(text.hidden_size)
    if head == "lm" and not getattr(text, "tie_word_embeddings", True):
        params += hidden * int(text.vocab_size)
    elif head != "lm":
        params += hidden + 1
    heads = int(text.num_attention_heads)
    kv_heads = int(getattr(text, "num_key_value_heads", None) or heads)
    head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
    intermediate = int(getattr(text, "intermediate_size", None) or getattr(text, "n_inner", None) or 4 * hidden)
    return mem.ModelShape(params=params, layers=int(text.num_hidden_layers), hidden=hidden,
                          intermediate=intermediate, vocab=int(text.vocab_size), kv_width=kv_heads * head_dim)


def model_shapes(cfg: RLConfig) -> dict[str, mem.ModelShape]:
    """The shape of every model the config uses, keyed by role (read once; what-if plans reuse it)."""
    arr = cfg.actor_rollout_ref
    shapes = {"actor": model_shape(str(arr.model.path), "lm")}
    if cfg.use_critic:
        shapes["critic"] = model_shape(str(cfg.critic.model.path or arr.model.path), "value")
    if cfg.reward_model.enable:
        shapes["reward"] = model_shape(str(cfg.reward_model.model.path), "score")
    return shapes


def sharding(strategy: str, deepspeed: Any, world: int) -> mem.Sharding:
    if strategy == "fsdp2":
        return mem.Sharding(world, params=True, grads_and_optimizer=True)
    if strategy == "deepspeed":
        zero3 = deepspeed.zero_stage == 3
        return mem.Sharding(world, params=zero3, grads_and_optimizer=True, deepspeed_optimizer=True,
                            offload_params=zero3 and deepspeed.offload_param,
                            offload_optimizer=deepspeed.offload_optimizer)
    return mem.Sharding(world)


def training_tokens(micro: int | None, dynamic: bool, budget: int, local_rows: int, length: int) -> int:
    """Tokens of the largest training micro-batch on one worker."""
    if dynamic:
        return min(budget, local_rows * length)
    return (micro or local_rows) * length


def plan_rl(cfg: RLConfig, device_memory: int | None = None, shapes: dict[str, mem.ModelShape] | None = None) -> Plan:
    """The plan of ``cfg``; ``device_memory`` in bytes per device (None: detect)."""
    arr = cfg.actor_rollout_ref
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    device = resolve_device(cfg.trainer.device)
    shapes = shapes or model_shapes(cfg)
    p_bytes = DTYPE_BYTES[arr.model.dtype]
    c_bytes = 2 if cfg.trainer.precision == "bf16" or p_bytes == 2 else 4
    roles = [_actor(cfg, shapes["actor"], world, p_bytes, c_bytes)]
    if cfg.use_critic:
        roles.append(_critic(cfg, shapes["critic"], world, p_bytes, c_bytes))
    if cfg.reward_model.enable:
        roles.append(_reward(cfg, shapes["reward"], world, p_bytes, c_bytes))
    available = device_memory if device_memory is not None else detect_device_memory(device, cfg.trainer.n_gpus_per_node)
    if arr.rollout.name == "vllm" and available is not None:
        # vLLM takes its fraction of the device for weights and KV cache while it generates.
        roles[0].phases["rollout"] = {"vllm reserve": int(arr.rollout.gpu_memory_utilization * available)}
    peak, phase = mem.device_peak(roles)
    return Plan(roles, peak, phase, available, device, world)


def _actor(cfg: RLConfig, shape: mem.ModelShape, world: int, p: int, c: int) -> mem.RoleMemory:
    arr = cfg.actor_rollout_ref
    actor = arr.actor
    s = sharding(actor.strategy, actor.deepspeed, world)
    n = arr.rollout.n
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    rows = cfg.data.train_batch_size * n // world
    mini_rows = actor.ppo_mini_batch_size * n // world
    train_tokens = training_tokens(actor.ppo_micro_batch_size_per_gpu, actor.use_dynamic_bsz,
                                   actor.ppo_max_token_len_per_gpu, mini_rows, length)
    response_share = cfg.data.max_response_length / length
    role = mem.RoleMemory("actor")
    lora = arr.model.lora_rank > 0  # adapters train (their few parameters are not counted); no reference copy
    trained = 0 if lora else shape.params
    role.resident = {"weights": mem.weights_bytes(shape.params, p, s),
                     "gradients": mem.gradient_bytes(trained, p, s),
                     "optimizer": mem.optimizer_bytes(trained, p, s)}
    if not lora:
        role.resident["reference weights"] = mem.weights_bytes(shape.params, p, s)
    role.phases["rollout"] = {
        "kv cache": mem.kv_cache_bytes(shape, rows, length, c),
        "gathered weights": mem.gathered_bytes(shape, p, s, whole=True),
        "logits": rows * shape.vocab * 4}
    role.phases["update"] = {
        "activations": mem.activation_bytes(shape, train_tokens, c, arr.model.enable_gradient_checkpointing),
        "logits": mem.logits_bytes(shape.vocab, int(train_tokens * response_share), c, training=True),
        "gathered block": mem.gathered_bytes(shape, p, s, whole=False),
        "autocast weight copies": mem.autocast_copy_bytes(shape.params, p, c)}
    log_rows = arr.rollout.log_prob_micro_batch_size_per_gpu or rows
    role.phases["log-probs"] = {
        "forward": mem.forward_bytes(shape, log_rows * length, c),
        "logits": mem.logits_bytes(shape.vocab, log_rows * cfg.data.max_response_length, c, training=False),
        "gathered block": mem.gathered_bytes(shape, p, s, whole=False)}
    return role


def _critic(cfg: RLConfig, shape: mem.ModelShape, world: int, p: int, c: int) -> mem.RoleMemory:
    critic = cfg.critic
    s = sharding(critic.strategy, critic.deepspeed, world)
    n = cfg.actor_rollout_ref.rollout.n
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    mini = critic.ppo_mini_batch_size or cfg.actor_rollout_ref.actor.ppo_mini_batch_size
    tokens = training_tokens(critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz,
                             critic.ppo_max_token_len_per_gpu, mini * n // world, length)
    role = mem.RoleMemory("critic")
    role.resident = {"weights": mem.weights_bytes(shape.params, p, s),
                     "gradients": mem.gradient_bytes(shape.params, p, s),
                     "optimizer": mem.optimizer_bytes(shape.params, p, s)}
    role.phases["update"] = {
        "activations": mem.activation_bytes(shape, tokens, c, critic.model.enable_gradient_checkpointing),
        "gathered block": mem.gathered_bytes(shape, p, s, whole=False),
        "autocast weight copies": mem.autocast_copy_bytes(shape.params, p, c)}
    return role


def _reward(cfg: RLConfig, shape: mem.ModelShape, world: int, p: int, c: int) -> mem.RoleMemory:
    rows = cfg.reward_model.micro_batch_size_per_gpu or 64
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    role = mem.RoleMemory("reward")
    role.resident = {"weights": shape.params * p}  # replicated on every worker
    role.phases["score"] = {"forward": mem.forward_bytes(shape, rows * length, c)}
    return role


def detect_device_memory(device: str, workers_per_node: int) -> int | None:
    """Bytes per worker: the GPU's total memory, or on CPU the machine's RAM shared by the workers
    of this node."""
    if device == "cuda":
        import torch

        return int(torch.cuda.mem_get_info(0)[1])
    try:
        ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None
    return ram // max(1, workers_per_node)


def what_ifs(cfg: RLConfig, plan: Plan, shapes: dict[str, mem.ModelShape]) -> list[tuple[str, int]]:
    """Changes that lower the peak, each with the peak it would give (only changes not already made)."""
    from alignctl.config.core import load_config, to_dict

    arr, critic = cfg.actor_rollout_ref, cfg.critic
    options: list[list[str]] = []
    if not arr.model.enable_gradient_checkpointing or (cfg.use_critic and not critic.model.enable_gradient_checkpointing):
        options.append(["actor_rollout_ref.model.enable_gradient_checkpointing=true",
                        "critic.model.enable_gradient_checkpointing=true"])
    if arr.actor.ppo_micro_batch_size_per_gpu != 1 or arr.actor.use_dynamic_bsz:
        options.append(["actor_rollout_ref.actor.use_dynamic_bsz=false", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                        "critic.use_dynamic_bsz=false", "critic.ppo_micro_batch_size_per_gpu=1",
                        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1"])
    if cfg.trainer.precision != "bf16":
        options.append(["trainer.precision=bf16"])
    if plan.world > 1 and "fsdp2" not in (arr.actor.strategy, critic.strategy):
        options.append(["actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2"])
    if plan.device == "cuda" and not arr.actor.deepspeed.offload_optimizer:
        options.append(["actor_rollout_ref.actor.strategy=deepspeed", "actor_rollout_ref.actor.deepspeed.zero_stage=3",
                        "actor_rollout_ref.actor.deepspeed.offload_optimizer=true",
                        "actor_rollout_ref.actor.deepspeed.offload_param=true"])
    options.append([f"trainer.n_gpus_per_node={2 * cfg.trainer.n_gpus_per_node}"])
    current = to_dict(cfg)
    out: list[tuple[str, int]] = []
    for overrides in options:
        try:
            changed = load_config(RLConfig, None, overrides, base=current)
        except UserError:
            continue  # e.g. batch sizes that no longer divide the workers
        peak = plan_rl(changed, plan.device_memory, shapes).peak
        if peak < plan.peak:
            out.append((" ".join(o for o in overrides if _differs(current, o)), peak))
    return sorted(out, key=lambda item: item[1])


def _differs(current: dict[str, Any], override: str) -> bool:
    """Whether ``key=value`` changes the config ``current`` (so a suggestion lists only what the
    user must add)."""
    key, _, value = override.partition("=")
    node: Any = current
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return str(node).lower() != value.lower()
