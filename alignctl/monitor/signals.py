"""Cheap per-step signals computed from a batch the loop already holds (no extra forward pass)."""

from __future__ import annotations

from collections import defaultdict

import torch


def response_diversity(responses: torch.Tensor, response_mask: torch.Tensor,
                       group_index: torch.Tensor | None) -> dict[str, float]:
    """How alike the sampled responses are.

    ``monitor/unique_in_batch``: distinct responses / responses, over the whole batch (1.0: all
    different; near 0: the policy answers every prompt the same way, e.g. "#### 28");
    ``monitor/dup_in_group``: mean over prompt groups of the share of a group's responses that
    repeat another response of the same group; ``monitor/responses``: how many responses the
    batch holds (the baseline tests weigh a step's evidence by it).

    Shapes: responses ``[N, T]`` token ids, response_mask ``[N, T]``, group_index ``[N]``."""
    lengths = response_mask.sum(-1).tolist()
    texts = [tuple(row[: int(n)]) for row, n in zip(responses.tolist(), lengths)]
    if not texts:
        return {}
    metrics = {"monitor/unique_in_batch": len(set(texts)) / len(texts), "monitor/responses": float(len(texts))}
    if group_index is not None:
        groups: dict[int, list[tuple[int, ...]]] = defaultdict(list)
        for uid, text in zip(group_index.tolist(), texts):
            groups[int(uid)].append(text)
        shares = [1 - len(set(members)) / len(members) for members in groups.values() if len(members) > 1]
        if shares:
            metrics["monitor/dup_in_group"] = sum(shares) / len(shares)
    return metrics
