"""Micro-batches: fixed-size, token-budgeted (balanced), and data-parallel balancing.

Everything returns *index lists* into the original batch, so results computed micro-batch by
micro-batch can be put back in the original order (:func:`restore_order`).

Balanced partition = Karmarkar-Karp's largest differencing method (LDM) for k-way partitioning:
every item starts as a k-tuple of subsets (the item in one, the rest empty); repeatedly take the
two tuples with the largest spread (max - min subset sum) and merge them, pairing the heaviest
subset of one with the lightest of the other. Starting from k-tuples of one item per subset (items
taken in descending order, k at a time) keeps every subset the same size, which is what data
parallel ranks need (each rank gets n/k samples).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

import torch

from alignctl.errors import UserError

Partition = list[list[int]]


def _spread(sums: list[int]) -> int:
    return max(sums) - min(sums)


def karmarkar_karp(weights: Sequence[int], k: int, equal_size: bool = False) -> Partition:
    """Split item indices into ``k`` subsets with near-equal weight sums (LDM).

    ``equal_size`` additionally makes every subset hold ``len(weights) / k`` items (requires
    divisibility). Subsets are returned with indices ascending, ordered by their smallest index."""
    n = len(weights)
    if k < 1:
        raise ValueError(f"number of parts must be >= 1, got {k}")
    if equal_size and n % k:
        raise ValueError(f"{n} items cannot be split into {k} equal-size parts")
    order = sorted(range(n), key=lambda i: (-weights[i], i))
    step = k if equal_size else 1
    heap: list[tuple[int, int, list[int], list[list[int]]]] = []
    for tie, start in enumerate(range(0, n, step)):
        items = order[start : start + step]
        subsets = [[i] for i in items] + [[] for _ in range(k - len(items))]
        sums = [sum(weights[i] for i in s) for s in subsets]
        heapq.heappush(heap, (-_spread(sums), tie, sums, subsets))
    tie = len(heap)
    while len(heap) > 1:
        _, _, sums_a, sets_a = heapq.heappop(heap)
        _, _, sums_b, sets_b = heapq.heappop(heap)
        a = sorted(range(k), key=lambda j: -sums_a[j])  # heaviest first
        b = sorted(range(k), key=lambda j: sums_b[j])  # lightest first
        sums = [sums_a[i] + sums_b[j] for i, j in zip(a, b)]
        sets = [sets_a[i] + sets_b[j] for i, j in zip(a, b)]
        heapq.heappush(heap, (-_spread(sums), tie, sums, sets))
        tie += 1
    subsets = heap[0][3] if heap else [[] for _ in range(k)]
    return _canonical(subsets)


def _canonical(parts: Partition) -> Partition:
    parts = [sorted(p) for p in parts]
    return sorted(parts, key=lambda p: (not p, p[0] if p else 0))


def fixed_micro_batches(batch_size: int, micro_batch_size: int) -> Partition:
    """Consecutive chunks of ``micro_batch_size`` (the last may be shorter)."""
    if micro_batch_size < 1:
        raise UserError(f"micro batch size must be >= 1, got {micro_batch_size}")
    return [list(range(s, min(s + micro_batch_size, batch_size))) for s in range(0, batch_size, micro_batch_size)]


def dynamic_micro_batches(
    seq_lens: Sequence[int], max_token_len: int, min_num_micro_batches: int = 1
) -> Partition:
    """Fewest balanced micro-batches whose token sums stay within ``max_token_len``.

    Starts from the lower bound ceil(total / budget) and adds a bin while the balanced partition
    still overflows (LDM is not optimal, so the bound is not always reachable)."""
    lens = [int(x) for x in seq_lens]
    if not lens:
        return []
    longest = max(lens)
    if longest > max_token_len:
        raise UserError(
            f"max_token_len={max_token_len} is smaller than the longest sequence ({longest} tokens); "
            "expected max_token_len >= prompt + response length"
        )
    k = max(math.ceil(sum(lens) / max_token_len), min_num_micro_batches, 1)
    k = min(k, len(lens))
    while True:
        parts = [p for p in karmarkar_karp(lens, k) if p]
        if all(sum(lens[i] for i in p) <= max_token_len for p in parts) or k >= len(lens):
            return parts
        k += 1


def balance_batch(seq_lens: Sequence[int], world_size: int) -> list[int]:
    """Permutation of the batch so that the contiguous split into ``world_size`` equal chunks
    (rank r gets ``perm[r*n/w:(r+1)*n/w]``) gives every rank nearly the same token count."""
    n = len(seq_lens)
    if world_size < 1 or n % world_size:
        raise UserError(f"batch of {n} samples cannot be split evenly over world_size={world_size}")
    parts = karmarkar_karp([int(x) for x in seq_lens], world_size, equal_size=True)
    return [i for part in parts for i in part]


def balance_groups(group_ids: Sequence[int], prompt_lens: Sequence[int], response_lens: Sequence[int],
                   world_size: int) -> list[int] | None:
    """Like :func:`balance_batch`, but the rows of a group (one prompt's n responses) stay together
    and adjacent, so a rank can compute the group's prompt once (shared-prompt packing); a group
    costs its prompt once plus all its responses. None when groups cannot be split evenly (unequal
    group sizes, or a group count not divisible by ``world_size``): balance rows instead."""
    members: dict[int, list[int]] = {}
    for row, gid in enumerate(group_ids):
        members.setdefault(int(gid), []).append(row)
    groups = list(members.values())
    if len({len(rows) for rows in groups}) != 1 or len(groups) % world_size:
        return None
    costs = [int(prompt_lens[rows[0]]) + sum(int(response_lens[r]) for r in rows) for rows in groups]
    parts = karmarkar_karp(costs, world_size, equal_size=True)
    return [row for part in parts for g in part for row in groups[g]]


def split_by_indices(tensor: torch.Tensor, parts: Partition) -> list[torch.Tensor]:
    """Rows of ``tensor`` (dim 0) gathered per micro-batch."""
    return [tensor[torch.as_tensor(p, dtype=torch.long, device=tensor.device)] for p in parts]


def restore_order(outputs: Sequence[torch.Tensor], parts: Partition) -> torch.Tensor:
    """Inverse of :func:`split_by_indices`: concatenate per-micro-batch results (dim 0) and put
    each row back at its original index."""
    order = torch.as_tensor([i for p in parts for i in p], dtype=torch.long)
    stacked = torch.cat(list(outputs), dim=0)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    return stacked[inverse.to(stacked.device)]
