"""Step metrics from a finished batch (verl's names) and step timing. Pure: tensors in, floats out."""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Iterator

import torch

from alignctl.algos import masked_mean, rollout_mismatch
from alignctl.batch import Batch

QUANTILES = (0.1, 0.5, 0.9)


def _stats(prefix: str, values: torch.Tensor) -> dict[str, float]:
    values = values.float()
    if values.numel() == 0:
        return {}
    return {f"{prefix}/mean": float(values.mean()), f"{prefix}/max": float(values.max()),
            f"{prefix}/min": float(values.min())}


def data_metrics(batch: Batch, max_response_length: int) -> dict[str, float]:
    """Scores, rewards, advantages, returns, values and lengths of one step's responses."""
    mask = batch["response_mask"].bool()
    lengths = mask.sum(-1)
    scores = batch["token_level_scores"].sum(-1)
    rewards = batch["token_level_rewards"].sum(-1)
    valid = mask.any(-1)
    metrics = {
        **_stats("critic/score", scores),
        **_stats("critic/rewards", rewards),
        **_stats("response_length", lengths),
        **_stats("prompt_length", batch["attention_mask"].sum(-1) - lengths),
        "response_length/clip_ratio": float((lengths >= max_response_length).float().mean()),
    }
    for name, key in (("advantages", "advantages"), ("returns", "returns"), ("values", "values")):
        if key in batch and valid.any():
            token_values = batch[key][mask]
            metrics.update(_stats(f"critic/{name}", token_values))
    if "values" in batch and "returns" in batch and mask.any():
        # Fraction of the return variance the critic explains (1 = perfect, <= 0 = no better than a constant).
        residual = (batch["returns"] - batch["values"])[mask].float()
        returns_var = batch["returns"][mask].float().var(unbiased=False)
        if returns_var > 0:  # undefined for constant returns
            metrics["critic/vf_explained_var"] = float(1 - residual.var(unbiased=False) / returns_var)
    # Watching the reward distribution, not only its mean, is how reward hacking is caught early.
    for q, value in zip(QUANTILES, torch.quantile(scores.float(), torch.tensor(QUANTILES)).tolist()):
        metrics[f"reward/p{int(q * 100)}"] = value
    return metrics


def kl_metrics(batch: Batch) -> dict[str, float]:
    """Mean per-token KL(actor || ref) estimate (k1) over response tokens, for monitoring."""
    if "ref_log_prob" not in batch or "old_log_probs" not in batch:
        return {}
    diff = batch["old_log_probs"] - batch["ref_log_prob"]
    return {"actor/reference_kl": float(masked_mean(diff, batch["response_mask"].float()))}


def rollout_mismatch_metrics(batch: Batch, policy_version: int | None = None) -> dict[str, float]:
    """How far the rollout engine's log-probs of the sampled tokens are from the recomputed old
    log-probs (absolute difference over response tokens): near 0 for hf in float32; what the PPO
    ratio would absorb with ``actor.recompute_old_log_prob=false``; with it, verl's ``rollout_corr/*``
    mismatch measures (KL k1/k3, chi-square, perplexities: algos/rollout_correction.py). Nothing when
    they were reused.

    Asynchronous loop (``policy_version``: the trainer's, the batch has a ``policy_version`` column):
    a stale response's gap also holds the policy's own change since it was sampled, so the same
    measures over the fresh responses alone (sampled by the weights being trained) are logged under
    ``rollout/fresh/`` and ``rollout_corr/fresh/``: the engine's own gap, when a step has any."""
    if batch.meta.get("old_log_probs_from") != "recomputed" or "rollout_log_probs" not in batch:
        return {}
    metrics = _mismatch(batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], "")
    if metrics and policy_version is not None and "policy_version" in batch:
        fresh = batch["policy_version"].long() == policy_version
        share = float(fresh.float().mean())
        if 0.0 < share < 1.0:  # all fresh: the whole batch's measures are the engine's own
            metrics |= _mismatch(batch["old_log_probs"][fresh], batch["rollout_log_probs"][fresh],
                                 batch["response_mask"][fresh], "fresh/")
        metrics["rollout/fresh/share"] = share
    return metrics


def _mismatch(old: torch.Tensor, engine: torch.Tensor, response_mask: torch.Tensor, prefix: str) -> dict[str, float]:
    mask = response_mask.bool()
    diff = (engine - old).abs()[mask]
    if diff.numel() == 0:
        return {}
    gap = rollout_mismatch(old, engine, response_mask)
    return {f"rollout/{prefix}log_prob_diff_mean": float(diff.mean()),
            f"rollout/{prefix}log_prob_diff_max": float(diff.max()),
            **{f"rollout_corr/{prefix}{name}": float(value) for name, value in gap.items()}}


class Timer:
    """``with timer("gen"): ...`` accumulates ``timing_s/gen``."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            key = f"timing_s/{name}"
            self.seconds[key] = self.seconds.get(key, 0.0) + time.perf_counter() - start

    def add(self, seconds: dict[str, float]) -> None:
        """Accumulate times measured elsewhere (calls that ran at once, each with its own time)."""
        for name, value in seconds.items():
            key = f"timing_s/{name}"
            self.seconds[key] = self.seconds.get(key, 0.0) + value

    def metrics(self) -> dict[str, float]:
        return dict(self.seconds)


def throughput(batch: Batch, step_seconds: float, world_size: int) -> dict[str, float]:
    tokens = float(batch["attention_mask"].sum())
    return {"perf/total_num_tokens": tokens, "perf/throughput": tokens / max(step_seconds, 1e-9) / world_size}


def tool_metrics(batch: Batch) -> dict[str, float]:
    """Multi-turn rollouts: turns per sample, calls per tool, failed calls by kind, the share of
    calls that ran (over every worker's rows), and rank 0's time in decoding vs in tools; with them,
    rank 0's rollout-engine facts (sleep active, weight syncs, the sync check's difference)."""
    if "turns" not in batch:
        return dict(batch.meta.get("rollout_metrics", {}))
    rows = max(len(batch), 1)
    calls: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    for row_calls, row_errors in zip(batch["tool_calls"], batch["tool_error_kinds"]):
        calls.update(row_calls)
        errors.update(row_errors)
    total = sum(calls.values())
    metrics = {"multi_turn/turns_mean": sum(batch["turns"]) / rows, "multi_turn/calls_per_sample": total / rows,
               "multi_turn/valid_call_share": sum(batch["tool_valid_calls"]) / total if total else 1.0}
    metrics |= {f"multi_turn/calls/{name}": float(n) for name, n in sorted(calls.items())}
    metrics |= {f"multi_turn/errors/{kind}": float(n) for kind, n in sorted(errors.items())}
    return metrics | dict(batch.meta.get("rollout_metrics", {}))
