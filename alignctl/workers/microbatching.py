"""Splitting a worker's share of a step into mini-batches and micro-batches.

Two rules keep the distributed update exact:

1. every rank runs the same number of micro-batches per mini-batch (sharded backends issue one
   collective per forward/backward, and gradient sync happens once per mini-batch), so dynamic
   token-budgeted micro-batching agrees on the largest count over ranks;
2. loss normalisers are the *mini-batch's* global token / sequence counts, summed over ranks, so
   the micro-batch losses add up to the whole mini-batch's loss however it was split.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from alignctl.algos import count_loss_seqs, count_loss_tokens
from alignctl.batch import Batch
from alignctl.models.batch_indices import dynamic_micro_batches, fixed_micro_batches
from alignctl.workers.strategy import all_reduce_max, collective_device


@dataclass
class MicroBatchPlan:
    micro_batch_size: int | None  # responses per micro-batch (None: the whole mini-batch)
    use_dynamic_bsz: bool = False
    max_token_len: int = 16384


def mini_batches(batch: Batch, rows: int, *, shuffle: bool, generator: torch.Generator | None) -> list[Batch]:
    """Consecutive mini-batches of ``rows`` responses (optionally in a seeded random order)."""
    if shuffle:
        batch = batch.index(torch.randperm(len(batch), generator=generator))
    return batch.split(rows)


def micro_batches(batch: Batch, plan: MicroBatchPlan) -> list[Batch]:
    if plan.use_dynamic_bsz:
        lengths = batch["attention_mask"].sum(-1).tolist()
        parts = dynamic_micro_batches(lengths, plan.max_token_len)
        wanted = all_reduce_max(len(parts))
        if wanted != len(parts):
            parts = dynamic_micro_batches(lengths, plan.max_token_len, min_num_micro_batches=wanted)
        return [batch.index(p) for p in parts]
    size = plan.micro_batch_size or len(batch)
    parts = fixed_micro_batches(len(batch), size)
    return [batch.index(p) for p in parts]


def global_counts(response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(tokens, sequences) with a non-empty response, summed over all ranks."""
    counts = torch.stack([count_loss_tokens(response_mask), count_loss_seqs(response_mask)]).float()
    counts = counts.to(collective_device())
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(counts)
    return counts[0], counts[1]


def all_reduce_sum(values: dict[str, torch.Tensor]) -> dict[str, float]:
    """Sum scalar metrics over ranks (each rank holds its additive share)."""
    if not values:
        return {}
    keys = sorted(values)
    device = collective_device()
    stacked = torch.stack([torch.as_tensor(values[k]).detach().float().reshape(()).to(device) for k in keys])
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(stacked)
    return dict(zip(keys, stacked.tolist()))
