"""Token entropy of the policy's next-token distribution (metric ``actor/entropy``, entropy bonus).

Notation:
    V: vocabulary size, z[..., v]: logits, l = log_softmax(z), p = exp(l)
    H = -sum_v p_v l_v

This is the one entropy of the package (``models/forward.py`` calls :func:`entropy_from_log_probs`
on the log-softmax it already has for the log-probs). ``log_softmax`` subtracts the row maximum
before exponentiating, so every ``l_v`` is accurate whatever the logits' offset, and a ``p_v`` that
underflows to 0 contributes 0. The algebraically equal ``logsumexp(z) - sum_v p_v z_v`` is not
used: for logits near 1e4 it subtracts two numbers near 1e4 in float32 and is wrong by whole nats.
Logits must be finite (large negative values are fine; -inf gives NaN).

The [B, T, V] logits of a long response batch are large; softmax would double that. With
``chunk_size`` the flattened tokens are processed ``chunk_size`` rows at a time, and when a
gradient is needed each chunk is recomputed in backward (activation checkpointing), so the extra
memory is one chunk's [chunk_size, V] instead of the whole tensor's. Rows are independent, so the
result equals the unchunked one.
"""

from __future__ import annotations

import torch
from torch.utils.checkpoint import checkpoint

__all__ = ["entropy_from_log_probs", "entropy_from_logits"]


def entropy_from_log_probs(log_probs: torch.Tensor) -> torch.Tensor:
    """``[..., V]`` normalised log-probabilities (a log-softmax) -> entropy ``[...]``."""
    return -(log_probs.exp() * log_probs).sum(dim=-1)


def _entropy_rows(logits: torch.Tensor) -> torch.Tensor:
    """``[N, V] -> [N]``; half-precision logits are upcast per call (i.e. per chunk)."""
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    return entropy_from_log_probs(torch.log_softmax(logits, dim=-1))


def entropy_from_logits(logits: torch.Tensor, chunk_size: int | None = None) -> torch.Tensor:
    """Entropy of ``softmax(logits)`` per position.

    Args:
        logits: ``[..., V]`` (e.g. ``[B, T, V]``).
        chunk_size: process at most this many flattened positions at once; ``None`` = all.

    Returns:
        ``[...]`` (e.g. ``[B, T]``), float32 for half-precision input, else ``logits.dtype``.
    """
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be a positive integer or None, got {chunk_size}")
    lead_shape = logits.shape[:-1]
    flat = logits.reshape(-1, logits.shape[-1])
    if chunk_size is None or flat.shape[0] <= chunk_size:
        return _entropy_rows(flat).reshape(lead_shape)
    needs_grad = torch.is_grad_enabled() and flat.requires_grad
    parts = []
    for chunk in flat.split(chunk_size, dim=0):
        if needs_grad:
            parts.append(checkpoint(_entropy_rows, chunk, use_reentrant=False))
        else:
            parts.append(_entropy_rows(chunk))
    return torch.cat(parts).reshape(lead_shape)
