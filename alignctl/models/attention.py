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

Shared-prompt layout (GRPO: n responses per prompt). A row may hold each distinct prompt once,
followed by the responses that continue it: ``[prompt][resp_1]...[resp_n]``. The layout is a tuple
of :class:`PrefixSpan` (start, end, prefix_start, prefix_end, head_start, head_end) tiling the row
in order: tokens of a span attend causally within the span plus to every token of its prefix (the
prompt); a prompt span has an empty prefix. When every prompt of a row starts with the same tokens
(a chat template's system message), that head is packed once at the start of the row:
``[head][rest_1][resp..][rest_2][resp..]``; a span's second range (head_start, head_end) points at
it, so a prompt's rest sees the head and a response sees the head and its prompt's rest. Plain
packing is the special case where every prefix is empty. It reaches the kernel as the
``alignctl_prefix_spans`` keyword of the model forward (transformers 5 forwards unknown kwargs
down to the attention function, as for ``cu_seq_lens_q``; checked for Llama and
Qwen2 on 5.23, with and without gradient checkpointing); :func:`prefix_causal_mask` is the same
layout as a dense mask for ``sdpa`` / ``eager``. Flash-attention varlen kernels cannot express it:
they take one contiguous key range per query segment, and the keys of resp_i (prompt + resp_i) are
not contiguous for i > 1, so callers fall back to plain packing there.

Note: restarting ``position_ids`` alone does not isolate sequences with sdpa (checked on
transformers 5.23, CPU): a real mask or varlen kernel is required.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
import torch.nn.functional as F

SEGMENT_SDPA = "alignctl_segment_sdpa"
# Attention implementations that isolate packed sequences from cu_seq_lens kwargs alone.
VARLEN_IMPLEMENTATIONS = frozenset({"flash_attention_2", "flash_attention_3", "flash_attention_4", SEGMENT_SDPA})
# Implementations that accept a dense 4D mask, and whether it must be additive float.
MASK_IMPLEMENTATIONS = {"sdpa": False, "eager": True}
# Implementations that can run the shared-prompt layout (see the module docstring).
PREFIX_IMPLEMENTATIONS = frozenset({SEGMENT_SDPA, *MASK_IMPLEMENTATIONS})
# Model-forward keyword carrying the layout down to :func:`segment_sdpa_attention`.
PREFIX_SPANS_KWARG = "alignctl_prefix_spans"


class PrefixSpan(NamedTuple):
    """Tokens [start, end) of a packed row: causal among themselves, and each also sees all of
    [prefix_start, prefix_end) (empty for a prompt or a plain packed sequence) and all of
    [head_start, head_end), the row's shared head (empty unless the row's prompts share one)."""

    start: int
    end: int
    prefix_start: int = 0
    prefix_end: int = 0
    head_start: int = 0
    head_end: int = 0

    def visible_ranges(self) -> list[tuple[int, int]]:
        """The non-empty ranges before the span that it sees, in row order (head first)."""
        ranges = [(self.head_start, self.head_end), (self.prefix_start, self.prefix_end)]
        return [(lo, hi) for lo, hi in ranges if hi > lo]


def check_prefix_spans(spans: tuple[PrefixSpan, ...]) -> None:
    """Spans must tile the row in order (the kernel concatenates their outputs); the head must lie
    before the prefix and the prefix before its span (causality: a token never sees a later one)."""
    position = 0
    for span in spans:
        if span.start != position or span.end <= span.start:
            raise ValueError(f"prefix spans must tile the row in order without empty spans, got {spans}")
        bound = 0
        for lo, hi in span.visible_ranges():
            if not bound <= lo < hi <= span.start:
                raise ValueError(f"head and prefix of {span} must lie before the span, head first")
            bound = hi
        position = span.end


def segment_lengths_to_cu(lengths: torch.Tensor) -> torch.Tensor:
    """[n] lengths -> [n+1] int32 cumulative offsets (flash-attention convention)."""
    cu = torch.zeros(lengths.numel() + 1, dtype=torch.int32, device=lengths.device)
    cu[1:] = lengths.cumsum(0)
    return cu


def _as_mask(allowed: torch.Tensor, additive_dtype: torch.dtype | None) -> torch.Tensor:
    """Bool [N, N] (True = attend) -> [1, 1, N, N] bool, or additive float for eager."""
    if additive_dtype is None:
        return allowed[None, None]
    additive = torch.zeros(allowed.shape, dtype=additive_dtype, device=allowed.device)
    return additive.masked_fill(~allowed, torch.finfo(additive_dtype).min)[None, None]


def block_causal_mask(lengths: torch.Tensor, additive_dtype: torch.dtype | None = None) -> torch.Tensor:
    """[1, 1, N, N] mask for sequences of ``lengths`` packed back to back (N = sum(lengths)).

    Token i may attend to token j iff both are in the same sequence and j <= i. Boolean (True =
    attend) by default; with ``additive_dtype``, 0 where allowed and the dtype's minimum elsewhere
    (what eager attention adds to its scores)."""
    n = int(lengths.sum())
    segment = torch.repeat_interleave(torch.arange(lengths.numel(), device=lengths.device), lengths)
    position = torch.arange(n, device=lengths.device)
    allowed = (segment[:, None] == segment[None, :]) & (position[None, :] <= position[:, None])
    return _as_mask(allowed, additive_dtype)


def prefix_causal_mask(
    spans: tuple[PrefixSpan, ...], additive_dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> torch.Tensor:
    """[1, 1, N, N] mask of a shared-prompt layout: :func:`block_causal_mask` over the spans, plus
    every token of a span may attend to its whole prefix. With all prefixes empty it equals
    ``block_causal_mask`` of the span lengths."""
    check_prefix_spans(spans)
    table = torch.tensor([list(span) for span in spans], dtype=torch.long, device=device)  # [n_spans, 6]
    segment = torch.repeat_interleave(torch.arange(len(spans), device=device), table[:, 1] - table[:, 0])
    position = torch.arange(segment.numel(), device=device)
    allowed = (segment[:, None] == segment[None, :]) & (position[None, :] <= position[:, None])
    for lo_col, hi_col in ((2, 3), (4, 5)):  # each query token's prefix range, then its head range
        lo, hi = table[segment, lo_col], table[segment, hi_col]
        allowed |= (position[None, :] >= lo[:, None]) & (position[None, :] < hi[:, None])
    return _as_mask(allowed, additive_dtype)


def _span_attention(
    query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, span: PrefixSpan, dropout_p: float, scale: float | None
) -> torch.Tensor:
    """sdpa for the queries of one span: [1, H, L, D]."""
    gqa = query.shape[1] != key.shape[1]
    s, e = span.start, span.end
    ranges = span.visible_ranges()
    if not ranges:  # no prefix: a plain causal segment (same call as before the shared layout existed)
        return F.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=dropout_p, is_causal=True, scale=scale, enable_gqa=gqa
        )
    k = torch.cat([*(key[:, :, lo:hi] for lo, hi in ranges), key[:, :, s:e]], dim=2)
    v = torch.cat([*(value[:, :, lo:hi] for lo, hi in ranges), value[:, :, s:e]], dim=2)
    # Lower-right causal: query i (of L) sees the whole prefix and span keys 0..i. is_causal=True
    # would align the triangle top-left (query i sees keys 0..i of the prefix only) when L != L_k;
    # an explicit mask rather than torch's CausalBias, which on CPU warns and materializes anyway.
    length, seen = e - s, sum(hi - lo for lo, hi in ranges)
    allowed = torch.ones(length, seen + length, dtype=torch.bool, device=query.device).tril(diagonal=seen)
    return F.scaled_dot_product_attention(
        query[:, :, s:e], k, v, attn_mask=allowed, dropout_p=dropout_p, scale=scale, enable_gqa=gqa
    )


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

    With ``alignctl_prefix_spans`` (shared-prompt layout) or ``cu_seq_lens_q`` (plain packing) each
    span / segment gets its own sdpa call and ``attention_mask`` is ignored (the packed forward
    passes a placeholder); without either, defer to transformers' sdpa (padded batches, generation
    with a KV cache)."""
    spans = kwargs.get(PREFIX_SPANS_KWARG)
    cu = kwargs.get("cu_seq_lens_q")
    if spans is None and cu is None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, is_causal=is_causal, **kwargs
        )
    if query.shape[0] != 1:
        raise ValueError(f"packed attention expects one row, got batch {query.shape[0]}")
    if spans is None:
        bounds = cu.tolist()
        spans = tuple(PrefixSpan(s, e) for s, e in zip(bounds[:-1], bounds[1:]))
    p = dropout if module.training else 0.0
    outputs = [_span_attention(query, key, value, span, p, scaling) for span in spans]
    return torch.cat(outputs, dim=2).transpose(1, 2).contiguous(), None


def flash_attn_installed() -> bool:
    """Whether the ``flash_attn`` package is importable here (found, not imported)."""
    import importlib.util

    return importlib.util.find_spec("flash_attn") is not None


# ``use_remove_padding`` / ``share_prompt`` default: decided per device by the resolvers below.
AUTO = "auto"


def resolve_packing(setting: bool | str, *, device: str) -> bool:
    """Whether forwards pack sequences into rows (RL's ``use_remove_padding``). ``True`` / ``False``
    are kept; ``auto`` packs off CUDA, and on CUDA only when flash-attn's varlen kernel is installed.

    Why: on a GPU without flash-attn, packed rows run :data:`SEGMENT_SDPA`, one small attention
    call per segment, and the many small kernels cost more than the padding they save. Measured on
    an H200 (SmolLM2-135M shapes, the quickstart's batch of 8 prompts x 4 responses):
    a no-grad log-prob pass of 32 responses 371 ms packed against 48 ms padded, an actor
    forward + backward of 16 responses 454 ms against 124 ms. On 2 CPU cores packing is the
    faster side (docs/gpu_and_cluster.md)."""
    if setting != AUTO:
        return bool(setting)
    return not device.startswith("cuda") or flash_attn_installed()


def resolve_share_prompt(setting: bool | str, *, device: str, packing: bool) -> bool:
    """Whether packed rows hold each distinct prompt once (``share_prompt``). Only packed rows can;
    ``auto`` shares off CUDA. On CUDA it does not: flash-attn cannot express the layout (module
    docstring) and the segment kernel is the slow side there (H200, same shapes as
    :func:`resolve_packing`: no-grad pass 580 ms shared against 48 ms padded; a reward-model step
    of 8 pairs 222 ms shared against 54 ms padded)."""
    if not packing:
        return False
    if setting != AUTO:
        return bool(setting)
    return not device.startswith("cuda")


def resolve_attn_implementation(name: str, *, device: str, packing: bool) -> str:
    """The kernel a model is loaded with, for every stage (``model.attn_implementation``).

    A name other than ``auto`` is returned unchanged. ``auto`` gives ``flash_attention_2`` when
    ``device`` is CUDA, rows are packed and ``flash_attn`` is installed; otherwise
    :data:`SEGMENT_SDPA` for packed rows (plain sdpa would let packed sequences attend to each
    other, and a dense block mask costs the square of the whole row), else ``sdpa``.

    ``device`` is where the model runs: a worker's device for RL roles, this process's for the
    TRL stages (sft, train-rm). ``packing``: RL's ``use_remove_padding``, SFT's ``packing``,
    train-rm's ``share_prompt``.

    One rule replaced two: the SFT/RM stages used to pick flash attention on any CUDA machine with
    flash_attn, packed or not. The RL rule is kept because flash attention's gain is the varlen
    path; on padded rows torch's sdpa already dispatches to a fused flash kernel on CUDA, and the
    hf rollout engine's preallocated decode mask is only used with sdpa.
    """
    if name != "auto":
        return name
    if packing and device.startswith("cuda") and flash_attn_installed():
        return "flash_attention_2"
    return SEGMENT_SDPA if packing else "sdpa"


def register() -> None:
    """Make ``attn_implementation="alignctl_segment_sdpa"`` loadable (idempotent)."""
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(SEGMENT_SDPA, segment_sdpa_attention)
    # Padded inputs need the same mask sdpa gets.
    AttentionMaskInterface.register(SEGMENT_SDPA, sdpa_mask)


register()
