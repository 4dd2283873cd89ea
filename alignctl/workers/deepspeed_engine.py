"""DeepSpeed ZeRO-2 / ZeRO-3 behind the :class:`~alignctl.workers.strategy.TrainEngine` interface.

Gradient accumulation stays ours. DeepSpeed runs with ``gradient_accumulation_steps=1`` and
``managed_gradient_accumulation=false``: ``backward`` only accumulates (ZeRO-2/3 reduce each
micro-batch's gradient into this rank's partition right away, as DeepSpeed always does for
partitioned gradients) and ``step`` is the accumulation boundary, however many micro-batches the
mini-batch had. With GAS=1 DeepSpeed divides no loss, and its reduction averages over ranks like
DDP, which is what the update loop's ``loss * world_size`` expects — so one DeepSpeed update equals
one ddp update on the same batch (tested in ``tests/test_rl_backends.py``).

ZeRO-3 shards the parameters too: a forward through the DeepSpeed engine gathers each layer just in
time (one collective per layer per forward). ``gathered()`` instead gathers every parameter once
and takes DeepSpeed's per-module hooks off, so generation and no-grad forwards on the plain module
issue no collective and ranks may run different numbers of forwards (decoding stops early).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

from alignctl.config.rl import DeepSpeedConfig
from alignctl.errors import UserError
from alignctl.workers.train_engine import TrainEngine

# The sub-folder name DeepSpeed's checkpoint gets inside a worker's checkpoint folder.
_DS_TAG = "deepspeed"
# DeepSpeed prints a progress line every ``steps_per_print`` optimizer steps: never.
_NEVER = 2**62


def deepspeed_config(options: DeepSpeedConfig, *, dtype: torch.dtype, on_gpu: bool) -> dict[str, Any]:
    """The DeepSpeed JSON config for ``options`` (pure: no DeepSpeed import)."""
    zero: dict[str, Any] = {"stage": options.zero_stage,
                            "stage3_param_persistence_threshold": options.param_persistence_threshold}
    if options.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": on_gpu}
    if options.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": on_gpu}
    return {
        "train_micro_batch_size_per_gpu": 1,  # bookkeeping only: our loop decides what a batch is
        "gradient_accumulation_steps": 1,
        "managed_gradient_accumulation": False,
        "gradient_clipping": 0.0,  # set per step from the step's grad_clip (see DeepSpeedEngine.step)
        "zero_optimization": zero,
        # bf16 weights: fp32 master copy; keep the inf/NaN check so a bad gradient skips the step.
        "bf16": {"enabled": dtype == torch.bfloat16, "check_grad_overflow": True},
        "zero_allow_untested_optimizer": True,  # torch AdamW, the same optimizer the other backends use
        "zero_force_ds_cpu_optimizer": False,
        "steps_per_print": _NEVER,
        "wall_clock_breakdown": False,
    }


def check_options(options: DeepSpeedConfig, dtype: torch.dtype, key: str) -> None:
    if options.offload_param and options.zero_stage != 3:
        raise UserError(f"key '{key}.offload_param' needs {key}.zero_stage=3 (ZeRO-2 does not shard parameters); "
                        f"got zero_stage={options.zero_stage}")
    if dtype == torch.float16:
        raise UserError(f"strategy=deepspeed ({key}) supports dtype float32 or bfloat16, not float16 "
                        f"(fp16 loss scaling skips steps, which the loop treats as a fatal non-finite gradient)")


class DeepSpeedEngine(TrainEngine):
    """A model under a DeepSpeed ZeRO engine. ``trainable=False`` gives a frozen ZeRO-3 model
    (the reference policy) with no optimizer; a trainable one is initialised by
    :meth:`attach_optimizer`, because DeepSpeed takes the optimizer at construction."""

    def __init__(self, model: nn.Module, world_size: int, *, options: DeepSpeedConfig | None = None,
                 key: str = "deepspeed", trainable: bool = True) -> None:
        super().__init__(model, world_size)
        self.options = options or DeepSpeedConfig()
        dtype = next(model.parameters()).dtype
        check_options(self.options, dtype, key)
        self.config = deepspeed_config(self.options, dtype=dtype, on_gpu=next(model.parameters()).is_cuda)
        self.ds: Any = None
        if not trainable:
            self.ds = self._initialize(optimizer=None, scheduler=None)

    # ------------------------------------------------------------------ construction

    def _initialize(self, optimizer: torch.optim.Optimizer | None,
                    scheduler: torch.optim.lr_scheduler.LambdaLR | None) -> Any:
        import deepspeed

        # The worker already formed the torch.distributed group (gloo / nccl): DeepSpeed reuses it.
        engine, *_ = deepspeed.initialize(model=self.model, optimizer=optimizer, lr_scheduler=scheduler,
                                          config=self.config, dist_init_required=False)
        return engine

    def attach_optimizer(self, optimizer: torch.optim.Optimizer,
                         scheduler: torch.optim.lr_scheduler.LambdaLR) -> None:
        # ZeRO re-points the optimizer's param groups at its flat fp32 partitions but keeps the group
        # dicts, so the LambdaLR built on ``optimizer`` still sets the learning rate DeepSpeed uses.
        super().attach_optimizer(optimizer, scheduler)
        # The schedule stays ours (stepped once per training step by the update loop); handed to
        # DeepSpeed it would advance on every optimizer step.
        self.ds = self._initialize(optimizer, scheduler=None)

    @property
    def zero3(self) -> bool:
        return self.options.zero_stage == 3

    @property
    def module(self) -> nn.Module:
        """The DeepSpeed engine: its forward fetches ZeRO-3 shards layer by layer."""
        return self.ds

    # ------------------------------------------------------------------ training

    def backward(self, loss: torch.Tensor) -> None:
        self.ds.backward(loss)

    def step(self, grad_clip: float) -> torch.Tensor:
        """One optimizer step over the micro-batches accumulated since the last one; returns the
        pre-clip global gradient norm (inf when DeepSpeed found a non-finite gradient and skipped)."""
        # DeepSpeed reads its clip threshold from config at construction; the ZeRO optimizers keep it
        # in ``clip_grad`` and read it at step time, so the loop's per-step value is honoured here.
        self.ds.optimizer.clip_grad = float(grad_clip) if grad_clip > 0 else 0.0
        self.ds.step()
        norm = self.ds.get_global_grad_norm()
        if norm is None or float(norm) < 0:  # DeepSpeed's "invalid" sentinel
            norm = float("inf")
        return torch.tensor(float(norm))

    # ------------------------------------------------------------------ checkpoints

    def save_weights_and_optimizer(self, folder: Path) -> None:
        """DeepSpeed's own checkpoint (collective): module and ZeRO optimizer partitions per rank (the
        base class adds our LR schedule). No ``latest`` file: the controller's commit decides what is complete."""
        self.ds.save_checkpoint(str(folder), tag=_DS_TAG, save_latest=False)

    def load_weights_and_optimizer(self, folder: Path) -> None:
        path, _ = self.ds.load_checkpoint(str(folder), tag=_DS_TAG, load_optimizer_states=True,
                                          load_lr_scheduler_states=False)
        if path is None:
            raise FileNotFoundError(f"{folder}: no DeepSpeed checkpoint (tag {_DS_TAG!r})")

    # ------------------------------------------------------------------ full weights

    @contextlib.contextmanager
    def gathered(self) -> Iterator[nn.Module]:
        if not self.zero3:
            yield self.model  # ZeRO-2 keeps full parameters on every rank
            return
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(self.model.parameters())), _zero3_hooks_removed(self.ds):
            yield self.model

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Complete CPU weights on every rank (ZeRO-3: one gather, collective)."""
        with self.gathered() as model:
            return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def _zero3_offload(ds_engine: Any) -> Any:
    """The object that owns ZeRO-3's per-module fetch/release hooks."""
    optimizer = ds_engine.optimizer
    return getattr(optimizer, "parameter_offload", optimizer)


@contextlib.contextmanager
def _zero3_hooks_removed(ds_engine: Any) -> Iterator[None]:
    """Without its hooks a module keeps the parameters GatheredParameters fetched: with them, every
    submodule forward would release (re-partition) its parameters and the next forward re-gather."""
    offload = _zero3_offload(ds_engine)
    for hook in [*offload.forward_hooks, *offload.backward_hooks]:
        hook.remove()
    offload.forward_hooks, offload.backward_hooks = [], []
    try:
        yield
    finally:
        offload._register_deepspeed_module(offload.module)
