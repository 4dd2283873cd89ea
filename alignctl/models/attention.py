"""Attention for packed sequences.

Packing puts several sequences in one row; attention must then stay inside each sequence. Two
ways, both exact (tested against unpacked runs):

- a dense block-diagonal causal mask (:func:`block_causal_mask`) handed to the model as a 4D mask:
  transformers passes a 4D mask through unchanged to ``sdpa`` (boolean, True = attend) and
  ``eager`` (additive float). Works with any attention implementation that takes a mask, but the
  attention cost is that of the whole row, O(row_len^2).
- varlen attention driven by ``cu_seq_lens_q/k`` keyword arguments, which transformers forwards to
  the attention function: ``flash_attention_2/3`` use them natively; on machines without flash
  attention, :data:`SEGMENT_SDPA` (registered below) runs ``scaled_dot_product_attention`` segment
  by segment, so the cost is sum(len_i^2). Without those kwargs it is plain ``sdpa``, so a model
  loaded with it generates and trains on padded batches exactly like ``sdpa``.

Note: restarting ``position_ids`` alone does not isolate sequences with sdpa (checked on
transformers 5.23, CPU): a real mask or varlen kernel is required.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

SEGMENT_SDPA = "alignctl_segment_sdpa"
# Attention implementations that isolate packed sequences from cu_seq_lens kwargs alone.
VARLEN_IMPLEMENTATIONS = frozenset({"flash_attention_2", "flash_attention_3", "flash_attention_4", SEGMENT_SDPA})
# Implementations that accept a dense 4D mask, and whether it must be additive float.
MASK_IMPLEMENTATIONS = {"sdpa": False, "eager": True}


def segment_lengths_to_cu(lengths: torch.Tensor) -> torch.Tensor:
    """[n] lengths -> [n+1] int32 cumulative offsets (flash-attention convention)."""
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    cu[1:] = lengths.cumsum(0)
    return cu


def block_causal_mask(lengths: torch.Tensor, additive_dtype: torch.dtype | None = None) -> torch.Tensor:
    """[1, 1, N, N] mask for sequences of ``lengths`` packed back to back (N = sum(lengths)).

    Token i may attend to token j iff both are in the same sequence and j <= i. Boolean (True =
    attend) by default; with ``additive_dtype``, 0 where allowed and the dtype's minimum elsewhere
    (what eager attention adds to its scores)."""
    n = int(lengths.sum())
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    position = torch.arange(n, device=lengths.device)
    allowed = (segment[:, None] == segment[None, :]) & (position[None, :] <= position[:, None])
    if additive_dtype is None:
        return allowed[None, None]
    additive = torch.zeros(n, n, dtype=additive_dtype, device=lengths.device)
    return additive.masked_fill(~allowed, torch.finfo(additive_dtype).min)[None, None]


def segment_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    is_causal: bool | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """Transformers attention function: query [1, H, N, D], key/value [1, Hkv, N, D] -> [1, N, H, D].

    With ``cu_seq_lens_q`` each packed segment gets its own causal sdpa call and ``attention_mask``
    is ignored (the packed forward passes a placeholder); without it, defer to transformers' sdpa
    (padded batches, generation with a KV cache)."""
    cu = kwargs.get("cu_seq_lens_q")
    if cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one row, got batch {query.shape[0]}")
    gqa = query.shape[1] != key.shape[1]
    p = dropout if module.training else 0.0
    bounds = cu.tolist()
    outputs = [
        F.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=p, is_causal=True, scale=scaling, enable_gqa=gqa
        )
        for s, e in zip(bounds[:-1], bounds[1:])
    ]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def register() -> None:
    """Make ``attn_implementation="alignctl_segment_sdpa"`` loadable (idempotent)."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(SEGMENT_SDPA, segment_sdpa_attention)
    # Padded inputs need the same mask sdpa gets.
    AttentionMaskInterface.register(SEGMENT_SDPA, sdpa_mask)


register()
