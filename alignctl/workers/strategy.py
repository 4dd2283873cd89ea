"""Training backends behind one small interface (:class:`~alignctl.workers.train_engine.TrainEngine`):
``ddp`` and ``fsdp2`` (torch) here, ``deepspeed`` (ZeRO-2/3, in :mod:`alignctl.workers.deepspeed_engine`,
imported only when chosen).

Every engine averages gradients over the data-parallel ranks, so a micro-batch loss must be
scaled by ``world_size`` (see :func:`alignctl.workers.actor` losses) for the sum over ranks and
micro-batches to equal the whole-batch loss. ``gathered()`` gives a context in which the full
parameters sit on the plain HF module, so generation and no-grad forwards run with no collective
per forward (ranks may then run different numbers of forwards, e.g. when decoding stops early).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from alignctl.models.blocks import transformer_blocks
from alignctl.workers.train_engine import TrainEngine


def build_optimizer(params: list[nn.Parameter], lr: float, weight_decay: float,
                    betas: list[float]) -> torch.optim.Optimizer:
    """AdamW, fused where torch has the kernel for these parameters (what TRL's stages use: transformers'
    default ``adamw_torch_fused``). The fused kernel updates every tensor in one pass instead of a dozen
    elementwise passes, several times faster on a CPU; the same update to float rounding
    (``tests/test_strategy_optimizer.py``)."""
    return torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(betas[0], betas[1]),
                             fused=fused_adamw_applies(params))


def fused_adamw_applies(params: list[nn.Parameter]) -> bool:
    """Plain floating-point tensors on the CPU or a CUDA device: not DTensor shards (FSDP2 keeps
    torch's default there) nor devices without the fused kernel."""
    return bool(params) and all(type(p) is nn.Parameter and p.is_floating_point()
                                and p.device.type in ("cpu", "cuda") for p in params)


def build_lr_scheduler(optimizer: torch.optim.Optimizer, *, total_steps: int, warmup_steps: int,
                       style: str, min_lr_ratio: float) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warm-up to the peak, then constant or cosine down to ``min_lr_ratio``."""

    def factor(step: int) -> float:
        if warmup_steps > 0 and step < warmup_steps:
            return (step + 1) / warmup_steps
        if style == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class DDPEngine(TrainEngine):
    def __init__(self, model: nn.Module, world_size: int) -> None:
        super().__init__(model, world_size)
        self.ddp = nn.parallel.DistributedDataParallel(model) if world_size > 1 else None
        if self.ddp is not None and hasattr(model, "config"):
            # The packed forward reads module.config to choose attention inputs; expose it on the wrapper.
            self.ddp.config = model.config

    @property
    def module(self) -> nn.Module:
        return self.ddp if self.ddp is not None else self.model

    @contextlib.contextmanager
    def grad_sync(self, enabled: bool) -> Iterator[None]:
        if self.ddp is None or enabled:
            yield
        else:
            with self.ddp.no_sync():
                yield


class FSDP2Engine(TrainEngine):
    """``fully_shard`` on every transformer block (one unit each, found from the model's
    ``_no_split_modules`` by :func:`alignctl.models.blocks.transformer_blocks`) and on the root.

    ``offload=True`` shards with torch's ``CPUOffloadPolicy``: the parameter shards, their gradients
    and (since the optimizer is built on those shards) the optimizer state stay in CPU memory; each
    unit's shards are copied to the device for its all-gather and the optimizer steps on the CPU.
    Pinned host memory is used when the device mesh is CUDA; pinning needs CUDA.

    The mesh is the process group's device (NCCL: CUDA, gloo: CPU), never ``fully_shard``'s default,
    which is CUDA whenever CUDA is visible: a CPU worker on a GPU machine (``trainer.device=cpu``)
    otherwise computed on cuda:0 and failed on its CPU batches (found on an H200, torch 2.11)."""

    def __init__(self, model: nn.Module, world_size: int, *, offload: bool = False) -> None:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy, fully_shard

        super().__init__(model, world_size)
        self.offload = offload
        device_type = collective_device().type
        mesh = init_device_mesh(device_type, (world_size,))
        policy = CPUOffloadPolicy(pin_memory=device_type == "cuda") if offload else OffloadPolicy()
        for block in transformer_blocks(model):
            fully_shard(block, mesh=mesh, offload_policy=policy)
        fully_shard(model, mesh=mesh, offload_policy=policy)
        self._fsdp_modules = [m for m in model.modules() if hasattr(m, "unshard") and hasattr(m, "reshard")]

    def clip_gradients(self, params: list[nn.Parameter], grad_clip: float) -> torch.Tensor:
        if not self.offload:
            return super().clip_gradients(params, grad_clip)
        # Offloaded gradients are CPU DTensors: their summed norm must reach the process group's
        # device before it is reduced over the workers (NCCL reduces only CUDA tensors; verl does
        # the same), then the scale comes back to the CPU for the gradients.
        from torch.nn.utils import clip_grads_with_norm_, get_total_norm

        norm = get_total_norm([p.grad for p in params if p.grad is not None]).to(collective_device())
        clip_grads_with_norm_(params, grad_clip if grad_clip > 0 else float("inf"), norm)
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    @contextlib.contextmanager
    def grad_sync(self, enabled: bool) -> Iterator[None]:
        self.model.set_requires_gradient_sync(enabled)
        try:
            yield
        finally:
            self.model.set_requires_gradient_sync(True)

    @contextlib.contextmanager
    def gathered(self) -> Iterator[nn.Module]:
        for module in self._fsdp_modules:
            module.set_reshard_after_forward(False)
            module.unshard()
        try:
            yield self.model
        finally:
            for module in self._fsdp_modules:
                module.reshard()
                module.set_reshard_after_forward(True)

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        return get_model_state_dict(self.model, options=options)


ENGINES: dict[str, type[TrainEngine]] = {"ddp": DDPEngine, "fsdp2": FSDP2Engine}


def make_engine(strategy: str, model: nn.Module, *, world_size: int, fsdp_offload: bool = False,
                **kwargs: Any) -> TrainEngine:
    """``fsdp_offload``: fsdp2's ``CPUOffloadPolicy`` (config validation allows it only with fsdp2).
    ``kwargs`` are DeepSpeed's (``options``: a DeepSpeedConfig, ``key``: its config path for error
    messages, ``trainable``); the torch backends take none and ignore them."""
    if fsdp_offload and strategy != "fsdp2":
        raise ValueError(f"fsdp_offload needs strategy fsdp2, got {strategy!r}")
    if strategy == "deepspeed":
        from alignctl.workers.deepspeed_engine import DeepSpeedEngine

        return DeepSpeedEngine(model, world_size, **kwargs)
    if strategy == "fsdp2":
        return FSDP2Engine(model, world_size, offload=fsdp_offload)
    if strategy not in ENGINES:
        raise ValueError(f"unknown strategy {strategy!r}; expected one of {', '.join([*ENGINES, 'deepspeed'])}")
    return ENGINES[strategy](model, world_size)


def collective_device() -> torch.device:
    """Where tensors for collectives must live: NCCL only reduces CUDA tensors."""
    if dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce_max(value: int) -> int:
    """The maximum of an int over all ranks (1 process: itself)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.long, device=collective_device())
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())
