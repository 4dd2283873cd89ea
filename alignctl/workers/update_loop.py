"""The data-parallel update loop shared by the actor and the critic.

``run_update`` walks epochs x mini-batches; ``update_mini_batch`` runs the micro-batches of one
mini-batch with gradient accumulation (sync only on the last), steps the optimizer once and
returns metrics summed over ranks. ``loss_fn(part, n_tok, n_seq) -> (loss, metrics)`` computes a
micro-batch's share of the mini-batch loss from the mini-batch's global counts.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from alignctl.batch import Batch
from alignctl.workers.microbatching import MicroBatchPlan, all_reduce_sum, global_counts, micro_batches
from alignctl.workers.microbatching import mini_batches
from alignctl.workers.train_engine import TrainEngine

LossFn = Callable[[Batch, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def update_mini_batch(engine: TrainEngine, mini: Batch, plan: MicroBatchPlan, *, world_size: int,
                      grad_clip: float, loss_fn: LossFn, prefix: str) -> dict[str, float]:
    n_tok, n_seq = global_counts(mini["response_mask"])
    parts = micro_batches(mini, plan)
    shares: dict[str, torch.Tensor] = {}
    for i, part in enumerate(parts):
        with engine.grad_sync(i == len(parts) - 1):
            loss, metrics = loss_fn(part, n_tok, n_seq)
            # Engines average gradients over ranks, and the loss is this rank's share of a sum.
            engine.backward(loss * world_size)
        for key, value in metrics.items():
            shares[key] = shares.get(key, 0.0) + value
    grad_norm = engine.step(grad_clip)
    if not torch.isfinite(grad_norm):
        raise FloatingPointError(f"{prefix} gradient norm is {float(grad_norm)}: the update was skipped "
                                 f"and the run stops so that no weights are corrupted")
    reduced = all_reduce_sum(shares)
    reduced[f"{prefix}/grad_norm"] = float(grad_norm)
    return reduced


def run_update(engine: TrainEngine, batch: Batch, plan: MicroBatchPlan, *, mini_rows: int, epochs: int,
               shuffle: bool, generator: torch.Generator, world_size: int, grad_clip: float,
               loss_fn: LossFn, prefix: str) -> dict[str, float]:
    """Metrics averaged over every optimizer step of the update, plus the learning rate it used;
    then one step of the LR schedule."""
    sums: dict[str, float] = {}
    steps = 0
    engine.module.train()
    for _ in range(epochs):
        for mini in mini_batches(batch, mini_rows, shuffle=shuffle, generator=generator):
            metrics = update_mini_batch(engine, mini, plan, world_size=world_size, grad_clip=grad_clip,
                                        loss_fn=loss_fn, prefix=prefix)
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
            steps += 1
    out = {key: value / steps for key, value in sums.items()}
    out[f"{prefix}/lr"] = engine.lr()  # the rate this update used
    engine.advance_schedule()
    return out
