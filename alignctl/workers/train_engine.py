"""The interface every training backend implements (one model trained data-parallel), with the
single-process behaviour as its defaults. Backends: :mod:`alignctl.workers.strategy` (ddp, fsdp2)
and :mod:`alignctl.workers.deepspeed_engine`; both import this module, neither imports the other's
internals, so the factory in ``strategy`` can load the DeepSpeed backend without an import cycle."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from alignctl.workers.checkpoint import SCHEDULER_FILE, load_model_and_optimizer, save_model_and_optimizer


class TrainEngine:
    """One model trained data-parallel; subclasses wrap it for a backend."""

    def __init__(self, model: nn.Module, world_size: int) -> None:
        self.model = model  # the plain HF module (after wrapping, FSDP2 shards it in place)
        self.world_size = world_size
        self.optimizer: torch.optim.Optimizer | None = None
        self.scheduler: torch.optim.lr_scheduler.LambdaLR | None = None

    @property
    def module(self) -> nn.Module:
        """The module to call for training forwards (with grad)."""
        return self.model

    def attach_optimizer(self, optimizer: torch.optim.Optimizer,
                         scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
        self.optimizer, self.scheduler = optimizer, scheduler

    @contextlib.contextmanager
    def grad_sync(self, enabled: bool) -> Iterator[None]:
        """Skip the gradient all-reduce for all but the last micro-batch of a step."""
        yield

    @contextlib.contextmanager
    def gathered(self) -> Iterator[nn.Module]:
        yield self.model

    def backward(self, loss: torch.Tensor) -> None:
        loss.backward()

    def step(self, grad_clip: float) -> torch.Tensor:
        """Clip, step, zero; returns the pre-clip global gradient norm."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        norm = self.clip_gradients(params, grad_clip)
        if torch.isfinite(norm):
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm.detach()

    def clip_gradients(self, params: list[nn.Parameter], grad_clip: float) -> torch.Tensor:
        """Scale the gradients to a global norm of at most ``grad_clip`` (<= 0: no clipping);
        returns the pre-clip norm as a plain tensor."""
        norm = torch.nn.utils.clip_grad_norm_(params, grad_clip if grad_clip > 0 else float("inf"))
        return norm.full_tensor() if hasattr(norm, "full_tensor") else norm

    def advance_schedule(self) -> None:
        """One LR-schedule step per training step (as verl), however many optimizer steps it took:
        ``lr_warmup_steps`` and the cosine length count RL steps, not mini-batches."""
        self.scheduler.step()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Complete weights (collective for sharded backends); plain tensors on CPU."""
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def lr(self) -> float:
        return float(self.scheduler.get_last_lr()[0])

    def save_state(self, folder: Path, *, is_writer: bool) -> None:
        """Weights, optimizer and LR schedule into ``folder`` (collective; see workers/checkpoint.py)."""
        self.save_weights_and_optimizer(folder)
        if is_writer:  # the schedule is the same on every rank
            torch.save(self.scheduler.state_dict(), folder / SCHEDULER_FILE)

    def load_state(self, folder: Path) -> None:
        """The inverse of :meth:`save_state`, into an engine built from the same config."""
        self.load_weights_and_optimizer(folder)
        self.scheduler.load_state_dict(torch.load(folder / SCHEDULER_FILE, weights_only=True))

    def save_weights_and_optimizer(self, folder: Path) -> None:
        save_model_and_optimizer(self.model, self.optimizer, folder)

    def load_weights_and_optimizer(self, folder: Path) -> None:
        load_model_and_optimizer(self.model, self.optimizer, folder)
