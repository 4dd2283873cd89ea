"""Everything the RL controller builds before the first step: data, loader, reward, workers."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignctl.config.core import to_dict
from alignctl.console import console
from alignctl.config.rl import RLConfig
from alignctl.device import resolve_device
from alignctl.data.rl_dataset import PromptLoader, RLPromptDataset, load_dataset_class
from alignctl.errors import UserError
from alignctl.models.loading import load_tokenizer
from alignctl.plugins import import_roots
from alignctl.tools import tool_schemas
from alignctl.trainers.reward import RewardComputer
from alignctl.workers.group import ResourcePool, RoleSpec, WorkerGroup, init_ray


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


def start_workers(cfg: RLConfig, total_steps: int) -> WorkerGroup:
    """One resource pool holding every role (the hybrid engine); Ray local unless an address is given."""
    world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node
    device = resolve_device(cfg.trainer.device)  # workers may be on other nodes: not checked here
    cpus = cfg.trainer.cpus_per_worker
    init_ray(cfg.trainer.ray_address, num_cpus=max(os.cpu_count() or 1, world * cpus))
    config = to_dict(cfg)
    roles = [RoleSpec("actor", "alignctl.workers.actor:ActorRolloutRefWorker",
                      {"config": config, "total_steps": total_steps})]
    if cfg.use_critic:
        roles.append(RoleSpec("critic", "alignctl.workers.critic:CriticWorker",
                              {"config": config, "total_steps": total_steps}))
    if cfg.reward_model.enable:
        roles.append(RoleSpec("rm", "alignctl.workers.reward_model:RewardModelWorker", {"config": config}))
    pool = ResourcePool(world, cpus=cpus, gpus=1 if device == "cuda" else 0)
    return WorkerGroup(pool, roles, import_paths=import_roots(cfg.algorithm.plugins))
