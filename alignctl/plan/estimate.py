"""``alignctl plan``: an RL config -> each role's memory per device, before any weights load.

Model shapes come from each folder's ``config.json`` (the parameter count from an empty model built
on the ``meta`` device, so any architecture transformers knows is counted exactly); the formulas
are in :mod:`alignctl.plan.memory`."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from alignctl.config.placement import pool_shapes
from alignctl.config.rl import RLConfig
from alignctl.device import resolve_device
from alignctl.errors import UserError
from alignctl.models.reward_kind import is_likelihood_reward_folder
from alignctl.plan import memory as mem
from alignctl.rollout.registry import engine_entry

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


# A plan's role names -> the trainer.placement keys that put them on a pool.
PLACEMENT_KEY = {"actor": "actor", "critic": "critic", "reward": "rm"}


@dataclass
class PoolPlan:
    """The roles that share one pool's devices, and the peak on each of them."""

    name: str
    world: int  # workers of the pool
    roles: list[mem.RoleMemory]
    peak: int
    peak_phase: str


@dataclass
class Plan:
    roles: list[mem.RoleMemory]
    peak: int  # the highest of the pools' peaks
    peak_phase: str
    device_memory: int | None  # bytes available per device (None: unknown)
    device: str
    world: int  # workers of the actor's pool
    pools: list[PoolPlan] = field(default_factory=list)

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
        path = str(cfg.reward_model.model.path)
        shapes["reward"] = model_shape(path, "lm" if is_likelihood_reward_folder(path) else "score")
    return shapes


def sharding(strategy: str, deepspeed: Any, world: int, *, fsdp_offload: bool = False, on_gpu: bool = True) -> mem.Sharding:
    """How a trained role's state is split and offloaded. Offload moves state from the device to
    CPU memory, which on a CPU worker is the same memory: it counts only when ``on_gpu``."""
    if strategy == "fsdp2":
        off = fsdp_offload and on_gpu  # CPUOffloadPolicy: shards, their gradients, the optimizer state
        return mem.Sharding(world, params=True, grads_and_optimizer=True, offload_params=off,
                            offload_optimizer=off, offload_grads=off)
    if strategy == "deepspeed":
        zero3 = deepspeed.zero_stage == 3
        return mem.Sharding(world, params=zero3, grads_and_optimizer=True, deepspeed_optimizer=True,
                            offload_params=zero3 and deepspeed.offload_param and on_gpu,
                            offload_optimizer=deepspeed.offload_optimizer and on_gpu)
    return mem.Sharding(world)


def reference_sharding(cfg: RLConfig, world: int, on_gpu: bool) -> mem.Sharding:
    """The frozen reference copy: sharded like the actor (fsdp2, ZeRO-3, which also takes the
    actor's ZeRO-3 offload_param), held whole otherwise; ``ref.fsdp_config.param_offload`` keeps it
    in CPU memory between reference passes (workers/model_setup.py:_reference_engine)."""
    actor = cfg.actor_rollout_ref.actor
    offload = cfg.actor_rollout_ref.ref.fsdp_config.param_offload and on_gpu
    sharded = actor.strategy == "fsdp2" or (actor.strategy == "deepspeed" and actor.deepspeed.zero_stage == 3)
    zero3_offload = actor.strategy == "deepspeed" and actor.deepspeed.offload_param and on_gpu
    return mem.Sharding(world, params=sharded, offload_params=offload or (sharded and zero3_offload))


def training_tokens(micro: int | None, dynamic: bool, budget: int, local_rows: int, length: int) -> int:
    """Tokens of the largest training micro-batch on one worker."""
    if dynamic:
        return min(budget, local_rows * length)
    return (micro or local_rows) * length


def plan_rl(cfg: RLConfig, device_memory: int | None = None, shapes: dict[str, mem.ModelShape] | None = None) -> Plan:
    """The plan of ``cfg``; ``device_memory`` in bytes per device (None: detect). Each role is sized
    for the world of its own pool (trainer.placement); roles on one pool share its devices, so the
    peak is taken per pool."""
    arr = cfg.actor_rollout_ref
    device = resolve_device(cfg.trainer.device)
    shapes = shapes or model_shapes(cfg)
    used = [name for name in ("actor", "critic", "reward") if name in shapes]
    placement = {name: getattr(cfg.trainer.placement, PLACEMENT_KEY[name]) for name in used}
    pools = pool_shapes(cfg.trainer, tuple(PLACEMENT_KEY[name] for name in used))
    world = {name: pools[placement[name]].world_size for name in used}
    p_bytes = DTYPE_BYTES[arr.model.dtype]
    c_bytes = 2 if cfg.trainer.precision == "bf16" or p_bytes == 2 else 4
    builders = {"actor": _actor, "critic": _critic, "reward": _reward}
    roles = [builders[name](cfg, shapes[name], world[name], p_bytes, c_bytes) for name in used]
    workers_per_node = sum(pool.workers_per_node for pool in pools.values())  # on one machine they share its RAM
    available = device_memory if device_memory is not None else detect_device_memory(device, workers_per_node)
    if engine_entry(arr.rollout.name).capabilities.device_fraction and available is not None:
        # Such an engine (vllm) takes its fraction of the device for weights and KV cache while it
        # generates, and keeps it between rollouts unless it sleeps (free_cache_engine).
        reserve = {f"{arr.rollout.name} reserve": int(arr.rollout.gpu_memory_utilization * available)}
        if arr.rollout.free_cache_engine:
            roles[0].phases["rollout"] = reserve
        else:
            roles[0].phases["rollout"], roles[0].resident = {}, {**roles[0].resident, **reserve}
    pool_plans = []
    for name, pool in pools.items():
        members = [role for role in roles if placement[role.name] == name]
        peak, phase = mem.device_peak(members)
        pool_plans.append(PoolPlan(name, pool.world_size, members, peak, phase))
    worst = max(pool_plans, key=lambda pool: pool.peak)
    phase = worst.peak_phase if len(pool_plans) == 1 else f"{worst.name}: {worst.peak_phase}"
    return Plan(roles, worst.peak, phase, available, device, world["actor"], pool_plans)


def _actor(cfg: RLConfig, shape: mem.ModelShape, world: int, p: int, c: int) -> mem.RoleMemory:
    arr = cfg.actor_rollout_ref
    actor = arr.actor
    on_gpu = resolve_device(cfg.trainer.device) == "cuda"
    s = sharding(actor.strategy, actor.deepspeed, world, fsdp_offload=actor.fsdp_config.offload_policy, on_gpu=on_gpu)
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
    if not lora and cfg.needs_reference:  # no KL term, no reference copy (model_setup.build_policy)
        role.resident["reference weights"] = mem.weights_bytes(shape.params, p, reference_sharding(cfg, world, on_gpu))
    role.phases["rollout"] = {
        "kv cache": mem.kv_cache_bytes(shape, rows, length, c),
        "gathered weights": mem.gathered_bytes(shape, p, s, whole=True),
        "logits": rows * shape.vocab * 4}
    role.phases["update"] = {
        "activations": mem.activation_bytes(shape, train_tokens, c, arr.model.enable_gradient_checkpointing),
        "logits": mem.logits_bytes(shape.vocab, int(train_tokens * response_share), c, training=True),
        "gathered block": mem.gathered_bytes(shape, p, s, whole=False),
        "autocast weight copies": mem.autocast_copy_bytes(shape.params, p, c)}
    role.phases["log-probs"] = _log_prob_phase(cfg, shape, arr.rollout.log_prob_micro_batch_size_per_gpu or rows,
                                               mem.gathered_bytes(shape, p, s, whole=True), c)
    if not lora and cfg.needs_reference:  # under LoRA the reference pass is the log-probs pass, adapters off
        ref_rows = arr.ref.log_prob_micro_batch_size_per_gpu or rows
        ref_weights = mem.gathered_bytes(shape, p, reference_sharding(cfg, world, on_gpu), whole=True)
        role.phases["ref log-probs"] = _log_prob_phase(cfg, shape, ref_rows, ref_weights, c)
    return role


def _log_prob_phase(cfg: RLConfig, shape: mem.ModelShape, rows: int, gathered: int, c: int) -> dict[str, int]:
    """A no-grad log-prob pass over ``rows`` responses. ``gathered()`` puts the whole model on the
    device for it (all shards gathered; an offloaded model brought in whole): ``gathered`` bytes."""
    length = cfg.data.max_prompt_length + cfg.data.max_response_length
    return {"forward": mem.forward_bytes(shape, rows * length, c),
            "logits": mem.logits_bytes(shape.vocab, rows * cfg.data.max_response_length, c, training=False),
            "gathered weights": gathered}


def _critic(cfg: RLConfig, shape: mem.ModelShape, world: int, p: int, c: int) -> mem.RoleMemory:
    critic = cfg.critic
    s = sharding(critic.strategy, critic.deepspeed, world, fsdp_offload=critic.model.fsdp_config.offload_policy,
                 on_gpu=resolve_device(cfg.trainer.device) == "cuda")
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
    weights = shape.params * p  # replicated on every worker
    role.phases["score"] = {"forward": mem.forward_bytes(shape, rows * length, c)}
    if is_likelihood_reward_folder(str(cfg.reward_model.model.path)):
        # A likelihood reward model: float32 logits and their log-softmax at every reply position.
        role.phases["score"]["reply logits"] = 2 * rows * cfg.data.max_response_length * shape.vocab * 4
    if cfg.reward_model.model.fsdp_config.param_offload and resolve_device(cfg.trainer.device) == "cuda":
        # In CPU memory between scoring passes: on the device only during its own phase (a worker
        # runs one role call at a time, so no other phase's transient memory is there with it).
        role.resident = {"weights": 0}
        role.phases["score"]["weights"] = weights
    else:
        role.resident = {"weights": weights}
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
    if plan.device == "cuda":
        options.extend(_offload_options(cfg))
        options.extend(_own_pool_options(cfg, plan))
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


def _offload_options(cfg: RLConfig) -> list[list[str]]:
    """What-ifs that move state to CPU memory (only worth suggesting for GPU workers)."""
    arr, options = cfg.actor_rollout_ref, []
    if not arr.actor.deepspeed.offload_optimizer:
        options.append(["actor_rollout_ref.actor.strategy=deepspeed", "actor_rollout_ref.actor.deepspeed.zero_stage=3",
                        "actor_rollout_ref.actor.deepspeed.offload_optimizer=true",
                        "actor_rollout_ref.actor.deepspeed.offload_param=true"])
    fsdp = ["actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.offload_policy=true"]
    if cfg.use_critic:
        fsdp += ["critic.strategy=fsdp2", "critic.model.fsdp_config.offload_policy=true"]
    options.append(fsdp)
    if arr.model.lora_rank == 0:
        options.append(["actor_rollout_ref.ref.fsdp_config.param_offload=true"])
    if cfg.reward_model.enable:
        options.append(["reward_model.model.fsdp_config.param_offload=true"])
    return options


def _own_pool_options(cfg: RLConfig, plan: Plan) -> list[list[str]]:
    """What-ifs that give the critic or the reward model GPUs of their own (a pool as large as the
    one it shares now, so every batch size still divides), when it shares the fullest pool."""
    fullest = max(plan.pools, key=lambda pool: pool.peak)
    if len(fullest.roles) < 2:
        return []
    size = pool_shapes(cfg.trainer)[fullest.name]
    options = []
    for role in fullest.roles:
        if role.name == "actor":
            continue
        pool = f"{role.name}_pool"
        options.append([f"trainer.pools.{pool}.nnodes={size.nnodes}",
                        f"trainer.pools.{pool}.workers_per_node={size.workers_per_node}",
                        f"trainer.placement.{PLACEMENT_KEY[role.name]}={pool}"])
    return options


def _differs(current: dict[str, Any], override: str) -> bool:
    """Whether ``key=value`` changes the config ``current`` (so a suggestion lists only what the
    user must add)."""
    key, _, value = override.partition("=")
    node: Any = current
    for part in key.split("."):
        node = node.get(part) if isinstance(node, dict) else None
    return str(node).lower() != value.lower()
