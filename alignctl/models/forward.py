"""Per-token log-probs, entropies and values of a response, padded or packed.

Layout (verl): a batch row is ``[left-padded prompt | right-padded response]`` of width S; the
response is the last T = ``response_length`` columns. Output column t (0 <= t < T) is about the
response token at column p+1 = S-T+t, computed from the model output at column p:

    log_probs[b, t] = log softmax(logits[b, p] / temperature)[input_ids[b, p+1]]
    entropy[b, t]   = entropy of that same distribution
    values[b, t]    = value_head(hidden[b, p])      (value of the state before the token)

Entries whose token (or the token before it) is padding are 0 in both paths.

``use_remove_padding=True`` drops the pads, concatenates the sequences into one row (or several,
each holding at most ``max_tokens_per_row`` tokens), restarts ``position_ids`` per sequence and
isolates the sequences with a real block-diagonal mask or varlen attention (see
:mod:`alignctl.models.attention`). Logits are only projected for the positions that are needed
(``logits_to_keep``), so pads cost nothing anywhere. Everything is differentiable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from alignctl.models.attention import (
    MASK_IMPLEMENTATIONS,
    SEGMENT_SDPA,
    VARLEN_IMPLEMENTATIONS,
    block_causal_mask,
    segment_lengths_to_cu,
)
from alignctl.models.loading import position_ids_from_mask


@dataclass(frozen=True)
class LogProbOutput:
    log_probs: torch.Tensor  # [B, T] float32
    entropy: torch.Tensor | None  # [B, T] float32, when asked for


# ---------------------------------------------------------------------------------------------
# Pure math on logits


def _logprob_entropy_chunk(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    z = logits.float() / temperature
    logp_all = F.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    # H = -sum p log p, with p = exp(log p): one pass over the vocabulary, no extra softmax.
    entropy = -(logp_all.exp() * logp_all).sum(-1)
    return logp, entropy


def logprobs_from_logits(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    chunk_size: int | None = 1024,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits [N, V], targets [N] -> (log p(target) [N], entropy [N] or None), float32.

    Works ``chunk_size`` rows at a time so the float32 log-softmax never exists for all N rows at
    once; under autograd each chunk is checkpointed (recomputed in backward) for the same reason."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    n = logits.shape[0]
    step = n if not chunk_size or chunk_size >= n else chunk_size
    use_ckpt = torch.is_grad_enabled() and logits.requires_grad and step < n
    logps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for start in range(0, max(n, 1), step):
        rows = slice(start, start + step)
        args = (logits[rows], targets[rows], temperature, compute_entropy)
        logp, ent = checkpoint(_logprob_entropy_chunk, *args, use_reentrant=False) if use_ckpt else _logprob_entropy_chunk(*args)
        logps.append(logp)
        ents.append(ent)
    return torch.cat(logps), (torch.cat(ents) if compute_entropy else None)


# ---------------------------------------------------------------------------------------------
# Which positions are wanted


def response_positions(attention_mask: torch.Tensor, response_length: int) -> torch.Tensor:
    """Bool [B, S]: column p is wanted iff p and p+1 are real tokens and p+1 is in the response."""
    batch, width = attention_mask.shape
    if not 0 < response_length < width:
        raise ValueError(f"response_length must be in (0, {width}), got {response_length}")
    real = attention_mask.bool()
    wanted = torch.zeros_like(real)
    wanted[:, :-1] = real[:, :-1] & real[:, 1:]
    wanted[:, : width - response_length - 1] = False
    return wanted


# ---------------------------------------------------------------------------------------------
# Packing plumbing


@dataclass(frozen=True)
class PackedRow:
    """Real tokens of some sequences of a padded batch, back to back in one row."""

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    lengths: torch.Tensor  # [n_seq] tokens per sequence
    flat_index: torch.Tensor  # [N] index of each token in the flattened [B*S] batch


def _row_groups(lengths: list[int], max_tokens_per_row: int | None) -> list[list[int]]:
    """Consecutive sequences, greedily, into rows of at most the budget (a longer sequence gets a
    row of its own). Empty sequences are left out: they have nothing to compute."""
    groups: list[list[int]] = [[]]
    used = 0
    for i, n in enumerate(lengths):
        if n == 0:
            continue
        if max_tokens_per_row is not None and groups[-1] and used + n > max_tokens_per_row:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return [g for g in groups if g]


def pack_padded(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    max_tokens_per_row: int | None = None,
) -> list[PackedRow]:
    """Remove pads from [B, S] tensors and pack the sequences into rows (order preserved)."""
    batch, width = input_ids.shape
    real = attention_mask.bool()
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    lengths = real.sum(1)
    offsets = torch.arange(batch, device=input_ids.device)[:, None] * width
    flat_all = (offsets + torch.arange(width, device=input_ids.device))[real]  # row-major = sequence order
    starts = torch.zeros(batch + 1, dtype=torch.long)
    starts[1:] = lengths.cpu().cumsum(0)
    rows = []
    for group in _row_groups(lengths.tolist(), max_tokens_per_row):
        flat = torch.cat([flat_all[starts[i] : starts[i + 1]] for i in group])
        rows.append(
            PackedRow(
                input_ids=input_ids.reshape(-1)[flat][None],
                position_ids=position_ids.reshape(-1)[flat][None],
                lengths=lengths[group],
                flat_index=flat,
            )
        )
    return rows


def attention_inputs(model: Any, row: PackedRow) -> dict[str, Any]:
    """Keyword arguments that make ``model`` attend within each packed sequence of ``row``."""
    config = getattr(model, "module", model).config  # DDP-style wrappers keep the model in .module
    impl = getattr(config, "_attn_implementation", None) or "eager"
    if impl in VARLEN_IMPLEMENTATIONS:
        cu = segment_lengths_to_cu(row.lengths)
        longest = int(row.lengths.max())
        varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
        # transformers hands a 4D mask through untouched; with None it would detect the restarted
        # positions and build an N x N packed mask (~80 ms at N=2304 on CPU) that segment attention
        # never reads. Flash attention must get None (it would unpad with a real mask).
        placeholder = torch.ones(1, 1, 1, 1, dtype=torch.bool, device=row.input_ids.device)
        return {"attention_mask": placeholder if impl == SEGMENT_SDPA else None, **varlen}
    if impl in MASK_IMPLEMENTATIONS:
        dtype = next(model.parameters()).dtype if MASK_IMPLEMENTATIONS[impl] else None
        return {"attention_mask": block_causal_mask(row.lengths, additive_dtype=dtype)}
    raise ValueError(f"packed forward does not support attn_implementation '{impl}'; use sdpa, eager or {sorted(VARLEN_IMPLEMENTATIONS)}")


@dataclass(frozen=True)
class _RowTargets:
    keep: torch.Tensor  # [K] positions inside the row whose outputs are needed
    targets: torch.Tensor  # [K] next-token ids
    out_index: torch.Tensor  # [K] index into the flattened [B*T] output


def _row_targets(row: PackedRow, wanted: torch.Tensor, input_ids: torch.Tensor, response_length: int) -> _RowTargets:
    width = input_ids.shape[1]
    keep = wanted.reshape(-1)[row.flat_index].nonzero().squeeze(-1)
    flat = row.flat_index[keep]
    b, p = flat // width, flat % width
    targets = input_ids[b, p + 1]
    out_index = b * response_length + (p + 1 - (width - response_length))
    return _RowTargets(keep, targets, out_index)


def _scatter(values: list[torch.Tensor], index: list[torch.Tensor], batch: int, response_length: int) -> torch.Tensor:
    flat = torch.cat(values)
    out = flat.new_zeros(batch * response_length).index_copy(0, torch.cat(index), flat)
    return out.view(batch, response_length)


# ---------------------------------------------------------------------------------------------
# Public entry points


def compute_log_probs(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    position_ids: torch.Tensor | None = None,
    temperature: float = 1.0,
    compute_entropy: bool = False,
    use_remove_padding: bool = True,
    max_tokens_per_row: int | None = None,
    entropy_chunk_size: int | None = 1024,
) -> LogProbOutput:
    """Log-probs (and entropy) [B, T] of the response tokens under a causal LM."""
    fn = _packed_log_probs if use_remove_padding else _padded_log_probs
    return fn(
        model, input_ids, attention_mask, response_length, position_ids,
        temperature, compute_entropy, max_tokens_per_row, entropy_chunk_size,
    )  # fmt: skip


def _padded_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
    position_ids: torch.Tensor | None, temperature: float, compute_entropy: bool,
    max_tokens_per_row: int | None, chunk: int | None,
) -> LogProbOutput:  # fmt: skip
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    batch, t = input_ids.shape[0], response_length
    # Keep the last T+1 positions and drop the final one: columns S-T-1 .. S-2 predict the response.
    logits = model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False, logits_to_keep=t + 1
    ).logits[:, :-1]
    targets = input_ids[:, -t:]
    logp, ent = logprobs_from_logits(logits.reshape(batch * t, -1), targets.reshape(-1), temperature, compute_entropy, chunk)
    wanted = response_positions(attention_mask, t)[:, -t - 1 : -1].to(logp.dtype)
    return LogProbOutput(logp.view(batch, t) * wanted, ent.view(batch, t) * wanted if ent is not None else None)


def _packed_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
    position_ids: torch.Tensor | None, temperature: float, compute_entropy: bool,
    max_tokens_per_row: int | None, chunk: int | None,
) -> LogProbOutput:  # fmt: skip
    wanted = response_positions(attention_mask, response_length)
    logps, ents, index = [], [], []
    for row in pack_padded(input_ids, attention_mask, position_ids, max_tokens_per_row):
        sel = _row_targets(row, wanted, input_ids, response_length)
        if sel.keep.numel() == 0:
            continue
        out = model(
            input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False,
            logits_to_keep=sel.keep, **attention_inputs(model, row),
        )  # fmt: skip
        logp, ent = logprobs_from_logits(out.logits[0], sel.targets, temperature, compute_entropy, chunk)
        logps.append(logp)
        ents.append(ent)
        index.append(sel.out_index)
    batch = input_ids.shape[0]
    if not index:  # no response tokens at all: zeros, still attached to nothing
        zeros = torch.zeros(batch, response_length, device=input_ids.device)
        return LogProbOutput(zeros, zeros.clone() if compute_entropy else None)
    entropy = _scatter(ents, index, batch, response_length) if compute_entropy else None
    return LogProbOutput(_scatter(logps, index, batch, response_length), entropy)


def compute_values(
    value_model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    position_ids: torch.Tensor | None = None,
    use_remove_padding: bool = True,
    max_tokens_per_row: int | None = None,
) -> torch.Tensor:
    """Values [B, T] (float32) of the states before each response token, for a :class:`ValueModel`."""
    wanted = response_positions(attention_mask, response_length)
    batch, t = input_ids.shape[0], response_length
    if not use_remove_padding:
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        values = value_model(input_ids, attention_mask=attention_mask, position_ids=position_ids)[:, -t - 1 : -1]
        return values * wanted[:, -t - 1 : -1].to(values.dtype)
    vals, index = [], []
    for row in pack_padded(input_ids, attention_mask, position_ids, max_tokens_per_row):
        sel = _row_targets(row, wanted, input_ids, response_length)
        if sel.keep.numel() == 0:
            continue
        kwargs = attention_inputs(value_model, row)
        row_values = value_model(row.input_ids, position_ids=row.position_ids, **kwargs)[0]
        vals.append(row_values[sel.keep])
        index.append(sel.out_index)
    if not index:
        return torch.zeros(batch, t, device=input_ids.device)
    return _scatter(vals, index, batch, t)
