"""Everything the RL controller builds before the first step: data, loader, reward, workers."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import ray

from alignctl.config.core import to_dict
from alignctl.config.placement import pool_shapes, pool_size_key, role_pools
from alignctl.console import console
from alignctl.cores import available_cores
from alignctl.config.rl import RLConfig
from alignctl.device import cuda_available, resolve_device
from alignctl.data.rl_dataset import PromptLoader, RLPromptDataset, load_dataset_class
from alignctl.errors import UserError
from alignctl.models.loading import load_tokenizer
from alignctl.plugins import import_roots
from alignctl.tools import tool_schemas
from alignctl.trainers.reward import RewardComputer
from alignctl.workers.group import ResourcePool, RoleSpec
from alignctl.workers.ray_session import cluster_address, init_ray
from alignctl.workers.pooled_workers import PooledWorkers, check_fit, cluster_nodes, start_pools


@dataclass
class RLComponents:
    tokenizer: Any
    train_data: Any
    val_data: Any | None
    loader: PromptLoader
    total_steps: int
    reward: RewardComputer
    run_dir: Path


def _dataset(cfg: RLConfig, files: list[str], tokenizer: Any, max_samples: int | None) -> Any:
    custom = cfg.data.custom_cls
    if custom.path and custom.name:
        cls = load_dataset_class(custom.path, custom.name)
        return cls(files, tokenizer, prompt_key=cfg.data.prompt_key, max_prompt_length=cfg.data.max_prompt_length,
                   max_samples=max_samples)
    mt = cfg.actor_rollout_ref.rollout.multi_turn
    tools = tool_schemas(mt.tools) if mt.enable else []  # the prompts then present the tool list
    return RLPromptDataset(files, tokenizer, prompt_key=cfg.data.prompt_key,
                           max_prompt_length=cfg.data.max_prompt_length, max_samples=max_samples, tools=tools)


def build_components(cfg: RLConfig) -> RLComponents:
    arr = cfg.actor_rollout_ref
    tokenizer = load_tokenizer(arr.model.tokenizer_path or arr.model.path, padding_side="left")
    train = _dataset(cfg, cfg.data.train_files, tokenizer, None)
    val = _dataset(cfg, cfg.data.val_files, tokenizer, cfg.data.max_val_samples) if cfg.data.val_files else None
    for name, data in (("train", train), ("val", val)):
        if data is not None and getattr(data, "filtered", 0):
            console.print(f"[yellow]{name}: {data.filtered} prompts longer than data.max_prompt_length="
                          f"{cfg.data.max_prompt_length} tokens were filtered out ({len(data)} kept)[/]")
    loader = PromptLoader(train, cfg.data.train_batch_size, shuffle=cfg.data.shuffle, seed=cfg.data.seed)
    total = cfg.trainer.total_training_steps or loader.steps_per_epoch * cfg.trainer.total_epochs
    if total < 1:
        raise UserError("trainer.total_training_steps / total_epochs give no training step")
    run_dir = cfg.trainer.resolved_run_dir
    return RLComponents(tokenizer, train, val, loader, total, RewardComputer(cfg, tokenizer), run_dir)


def start_workers(cfg: RLConfig, total_steps: int) -> PooledWorkers:
    """One worker group per resource pool (by default the single hybrid pool holding every role);
    Ray local unless an address is given. The pools are checked against the cluster first: before
    Ray starts for a local cluster, before any worker starts for a cluster being joined."""
    pools = run_pools(cfg)
    address = cluster_address(cfg.trainer.ray_address)
    if address is None and not ray.is_initialized():
        init_ray(None, num_cpus=check_local_fit(cfg, pools))
    else:
        init_ray(address)
        check_fit(pools, cluster_nodes(), pool_keys(cfg, pools), f"the Ray cluster at {address or 'this driver'}")
    config = to_dict(cfg)
    specs = {"actor": RoleSpec("actor", "alignctl.workers.actor:ActorRolloutRefWorker",
                               {"config": config, "total_steps": total_steps}),
             "critic": RoleSpec("critic", "alignctl.workers.critic:CriticWorker",
                                {"config": config, "total_steps": total_steps}),
             "rm": RoleSpec("rm", "alignctl.workers.rm_worker:RewardModelWorker", {"config": config}),
             "rollout": RoleSpec("rollout", "alignctl.workers.rollout_worker:RolloutWorker", {"config": config})}
    roles = {role: specs[role] for role in cfg.roles}
    return start_pools(pools, roles, role_pools(cfg.trainer, cfg.roles), import_roots(cfg.algorithm.plugins),
                       reuse=cfg.trainer.reuse_workers)


def run_pools(cfg: RLConfig) -> dict[str, ResourcePool]:
    """The pools this run starts; a worker gets one GPU when trainer.device resolves to cuda here
    (workers may be on other nodes: their devices are not checked here)."""
    return resource_pools(cfg, gpus=1 if resolve_device(cfg.trainer.device) == "cuda" else 0)


def pool_keys(cfg: RLConfig, pools: dict[str, ResourcePool]) -> dict[str, str]:
    """The config key that sizes each pool (named in errors)."""
    # a pool that does not fit the nodes: the node count is the key to change
    return {name: pool_size_key(cfg.trainer, name, default="trainer.nnodes") for name in pools}


def check_local_fit(cfg: RLConfig, pools: dict[str, ResourcePool] | None = None) -> int:
    """A private local cluster is one node with every core of this machine (at least as many as
    the workers ask for) and its GPUs: refuse pools it cannot hold (a pool spread over several
    nodes, more GPUs than there are). Returns the CPUs to start it with. Preflight runs this too,
    so ``--dry-run`` catches it."""
    pools = pools if pools is not None else run_pools(cfg)
    num_cpus = max(available_cores(), sum(p.world_size * p.cpus for p in pools.values()))
    local = {"CPU": float(num_cpus), "GPU": float(_local_gpus())}
    check_fit(pools, [local], pool_keys(cfg, pools), "this machine (a local Ray cluster is one node)")
    return num_cpus


def resource_pools(cfg: RLConfig, gpus: int) -> dict[str, ResourcePool]:
    """The pools holding this run's roles (``gpus``: per worker, unless a pool sets its own)."""
    return {name: ResourcePool(shape.world_size, cpus=shape.cpus, gpus=shape.gpus, name=name,
                               nnodes=shape.nnodes, strategy=shape.strategy, resources=dict(shape.resources))
            for name, shape in pool_shapes(cfg.trainer, cfg.roles, gpus_default=gpus).items()}


def _local_gpus() -> int:
    import torch

    return torch.cuda.device_count() if cuda_available() else 0
