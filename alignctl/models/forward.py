"""Per-token log-probs, entropies and values of a response, padded or packed.

Layout (verl): a batch row is ``[left-padded prompt | right-padded response]`` of width S; the
response is the last T = ``response_length`` columns. Output column t (0 <= t < T) is about the
response token at column p+1 = S-T+t, computed from the model output at column p:

    log_probs[b, t] = log softmax(logits[b, p] / temperature)[input_ids[b, p+1]]
    entropy[b, t]   = entropy of that same distribution
    values[b, t]    = score(hidden[b, p])           (value of the state before the token)

Entries whose token (or the token before it) is padding are 0 in both paths.

``use_remove_padding=True`` drops the pads, concatenates the sequences into one row (or several,
each holding at most ``max_tokens_per_row`` tokens), restarts ``position_ids`` per sequence and
isolates the sequences with a real block-diagonal mask or varlen attention (see
:mod:`alignctl.models.attention`). Logits are only projected for the positions that are needed
(``logits_to_keep``), so pads cost nothing anywhere. Everything is differentiable.

``share_prompt=True`` (with remove padding) is for GRPO-style batches where each prompt is sampled
n times: rows whose real prompt tokens (and their position ids) are identical form a group, and a
packed row holds each group as ``[prompt][resp_1]...[resp_n]``, so the prompt is computed once.
Prompt tokens attend causally within the prompt; resp_i attends to the whole prompt and causally
within itself, never to another response (:class:`~alignctl.models.attention.PrefixSpan`).
Position ids are copied from the padded batch (the prompt's from the group's first row, which all
its rows share), so every token sees exactly what it sees in the padded forward: the results are
the same math. The first token of resp_i is predicted from the output at the prompt's last token,
so that one packed position serves n targets (``logits_to_keep`` takes repeated indices; values
read it n times). With ``max_tokens_per_row`` rows break between groups, never inside one. Flash
attention cannot express the layout (see :mod:`alignctl.models.attention`): there
``share_prompt`` silently falls back to plain packing, which gives the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from alignctl.algos.entropy import entropy_from_log_probs
from alignctl.models.attention import (
    MASK_IMPLEMENTATIONS,
    PREFIX_IMPLEMENTATIONS,
    PREFIX_SPANS_KWARG,
    SEGMENT_SDPA,
    VARLEN_IMPLEMENTATIONS,
    PrefixSpan,
    block_causal_mask,
    check_prefix_spans,
    prefix_causal_mask,
    segment_lengths_to_cu,
)
from alignctl.models.loading import position_ids_from_mask


@dataclass(frozen=True)
class LogProbOutput:
    log_probs: torch.Tensor  # [B, T] float32
    entropy: torch.Tensor | None  # [B, T] float32, when asked for


# ---------------------------------------------------------------------------------------------
# Pure math on logits


def logprob_entropy_chunk(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    z = logits.float() / temperature
    logp_all = F.log_softmax(z, dim=-1)
    logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return logp, torch.zeros_like(logp)
    # The one entropy formula (algos.entropy), fed the log-softmax computed above: no second softmax.
    return logp, entropy_from_log_probs(logp_all)


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
        logp, ent = checkpoint(logprob_entropy_chunk, *args, use_reentrant=False) if use_ckpt else logprob_entropy_chunk(*args)
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
    """Real tokens of some sequences of a padded batch, back to back in one row.

    ``source_flat``/``source_packed`` say which packed position computes the output of each padded
    position the row covers. Plain packing: one to one (``flat_index`` inverted). Shared prompts:
    the prompt positions of every row of a group map to the one packed copy of the prompt. (Kept as
    a sparse pair rather than a dense [B*S] map per row, which would cost B*S longs per packed row.)
    """

    input_ids: torch.Tensor  # [1, N]
    position_ids: torch.Tensor  # [1, N]
    lengths: torch.Tensor  # [n_seg] tokens per attention segment (sequence, or prompt / response span)
    flat_index: torch.Tensor  # [N] index in the flattened [B*S] batch each token is read from
    source_flat: torch.Tensor  # [M] flattened [B*S] positions whose outputs this row computes
    source_packed: torch.Tensor  # [M] packed position computing each of them
    prefix_spans: tuple[PrefixSpan, ...] | None = None  # shared-prompt layout; None = plain segments


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


def _real_positions(attention_mask: torch.Tensor) -> tuple[torch.Tensor, list[int]]:
    """Flattened [B*S] indices of the real tokens, row-major (= sequence order), and where each
    batch row starts in that list ([B+1] offsets, host ints)."""
    batch, width = attention_mask.shape
    real = attention_mask.bool()
    offsets = torch.arange(batch, device=attention_mask.device)[:, None] * width
    flat_all = (offsets + torch.arange(width, device=attention_mask.device))[real]
    starts = [0, *real.sum(1).cpu().cumsum(0).tolist()]
    return flat_all, starts


def pack_padded(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor | None = None,
    max_tokens_per_row: int | None = None,
) -> list[PackedRow]:
    """Remove pads from [B, S] tensors and pack the sequences into rows (order preserved)."""
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    lengths = attention_mask.bool().sum(1)
    flat_all, starts = _real_positions(attention_mask)
    rows = []
    for group in _row_groups(lengths.tolist(), max_tokens_per_row):
        flat = torch.cat([flat_all[starts[i] : starts[i + 1]] for i in group])
        rows.append(
            PackedRow(
                input_ids=input_ids.reshape(-1)[flat][None],
                position_ids=position_ids.reshape(-1)[flat][None],
                lengths=lengths[group],
                flat_index=flat,
                source_flat=flat,
                source_packed=torch.arange(flat.numel(), device=flat.device),
            )
        )
    return rows


# ---------------------------------------------------------------------------------------------
# Shared-prompt packing (pure: index bookkeeping only)


def prompt_groups(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_length: int
) -> list[list[int]]:
    """Batch rows grouped by identical prompts, groups in order of first appearance.

    The prompt is the first S - T columns. Two rows match when their real tokens and position ids
    there are identical column by column (pads blanked): with left-padded prompts that is "same
    prompt". Matching position ids too keeps sharing exact even for unusual position ids."""
    cols = attention_mask.shape[1] - response_length
    pad = ~attention_mask[:, :cols].bool()
    key = torch.cat([input_ids[:, :cols].masked_fill(pad, -1), position_ids[:, :cols].masked_fill(pad, -1)], dim=1)
    _, inverse = torch.unique(key, dim=0, return_inverse=True)
    groups: dict[int, list[int]] = {}  # insertion order = first appearance
    for row, group in enumerate(inverse.tolist()):
        groups.setdefault(group, []).append(row)
    return list(groups.values())


@dataclass(frozen=True)
class _RowParts:
    """Flattened [B*S] positions of one batch row's real prompt and real response tokens."""

    prompt: torch.Tensor
    response: torch.Tensor


def _row_parts(attention_mask: torch.Tensor, response_length: int) -> list[_RowParts]:
    flat_all, starts = _real_positions(attention_mask)
    n_prompt = attention_mask[:, : attention_mask.shape[1] - response_length].bool().sum(1).tolist()
    return [
        _RowParts(flat_all[start : start + n], flat_all[start + n : end])
        for start, end, n in zip(starts[:-1], starts[1:], n_prompt)
    ]


def _group_size(members: list[int], parts: list[_RowParts]) -> int:
    """Packed tokens of a group; 0 when no row has a response (nothing to compute: dropped)."""
    responses = sum(parts[b].response.numel() for b in members)
    return parts[members[0]].prompt.numel() + responses if responses else 0


def _row_head_length(groups: list[list[int]], parts: list[_RowParts], input_ids: torch.Tensor,
                     position_ids: torch.Tensor) -> int:
    """Leading prompt tokens every group of a row has in common (same ids, same position ids): a
    chat template's system message. 0 for a row of one group, which gains nothing from it."""
    if len(groups) < 2:
        return 0
    prompts = [parts[members[0]].prompt for members in groups]
    n = min(prompt.numel() for prompt in prompts)
    if n == 0:
        return 0
    ids, pos = input_ids.reshape(-1), position_ids.reshape(-1)
    first = prompts[0][:n]
    same = torch.ones(n, dtype=torch.bool, device=input_ids.device)
    for prompt in prompts[1:]:
        same &= (ids[prompt[:n]] == ids[first]) & (pos[prompt[:n]] == pos[first])
    return int(same.long().cumprod(0).sum())  # the leading run of matches


def _shared_row(
    groups: list[list[int]], parts: list[_RowParts], input_ids: torch.Tensor, position_ids: torch.Tensor
) -> PackedRow:
    """One packed row ``[head][rest_1][resp..]..[rest_n][resp..]``: the prompts' common head once,
    then per group the rest of its prompt and its responses (no head: ``[prompt][resp..]``)."""
    device = input_ids.device
    head = _row_head_length(groups, parts, input_ids, position_ids)
    pieces, spans, src_flat, src_packed = [], [], [], []
    if head:
        pieces.append(parts[groups[0][0]].prompt[:head])
        spans.append(PrefixSpan(0, head))
    offset = head
    for members in groups:
        prompt = parts[members[0]].prompt  # the group's first row lends its copy of the prompt
        p0, p1 = offset, offset + prompt.numel() - head
        if p1 > p0:
            spans.append(PrefixSpan(p0, p1, head_end=head))
            pieces.append(prompt[head:])
        offset = p1
        for b in members:
            src_flat.append(parts[b].prompt)  # every row's prompt is computed by the shared copies
            src_packed.append(torch.cat([torch.arange(head, device=device), torch.arange(p0, p1, device=device)]))
            response = parts[b].response
            if response.numel() == 0:
                continue
            end = offset + response.numel()
            spans.append(PrefixSpan(offset, end, p0, p1, head_end=head))
            pieces.append(response)
            src_flat.append(response)
            src_packed.append(torch.arange(offset, end, device=device))
            offset = end
    layout = tuple(spans)
    check_prefix_spans(layout)
    flat = torch.cat(pieces)
    return PackedRow(
        input_ids=input_ids.reshape(-1)[flat][None],
        position_ids=position_ids.reshape(-1)[flat][None],
        lengths=torch.tensor([s.end - s.start for s in layout], device=device),
        flat_index=flat,
        source_flat=torch.cat(src_flat),
        source_packed=torch.cat(src_packed),
        prefix_spans=layout,
    )


def pack_shared_prompts(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    position_ids: torch.Tensor | None = None,
    max_tokens_per_row: int | None = None,
) -> list[PackedRow]:
    """Like :func:`pack_padded`, but each distinct prompt is packed once with all its responses
    after it (see the module docstring). Rows break between groups only; a group over the budget
    gets a row of its own; groups without any response token are left out."""
    response_positions(attention_mask, response_length)  # same validation of response_length
    if position_ids is None:
        position_ids = position_ids_from_mask(attention_mask)
    parts = _row_parts(attention_mask, response_length)
    groups = prompt_groups(input_ids, attention_mask, position_ids, response_length)
    sizes = [_group_size(members, parts) for members in groups]
    return [
        _shared_row([groups[i] for i in chosen], parts, input_ids, position_ids)
        for chosen in _row_groups(sizes, max_tokens_per_row)
    ]


# ---------------------------------------------------------------------------------------------
# Model plumbing


def _attn_implementation(model: Any) -> str:
    config = getattr(model, "module", model).config  # DDP-style wrappers keep the model in .module
    return getattr(config, "_attn_implementation", None) or "eager"


def pack_for_model(
    model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    position_ids: torch.Tensor | None = None,
    max_tokens_per_row: int | None = None,
    share_prompt: bool = False,
) -> list[PackedRow]:
    """Packed rows for ``model``: shared prompts when asked for and its attention can run them
    (segment sdpa, sdpa, eager); plain packing otherwise (flash attention), same results."""
    if share_prompt and _attn_implementation(model) in PREFIX_IMPLEMENTATIONS:
        return pack_shared_prompts(input_ids, attention_mask, response_length, position_ids, max_tokens_per_row)
    return pack_padded(input_ids, attention_mask, position_ids, max_tokens_per_row)


def _placeholder_mask(device: torch.device) -> torch.Tensor:
    # transformers hands a 4D mask through untouched; with None it would detect the restarted
    # positions and build an N x N packed mask (~80 ms at N=2304 on CPU) that segment attention
    # never reads.
    return torch.ones(1, 1, 1, 1, dtype=torch.bool, device=device)


def _mask_dtype(model: Any, impl: str) -> torch.dtype | None:
    return next(model.parameters()).dtype if MASK_IMPLEMENTATIONS[impl] else None


def attention_inputs(model: Any, row: PackedRow) -> dict[str, Any]:
    """Keyword arguments that make ``model`` attend within each packed sequence of ``row``."""
    impl = _attn_implementation(model)
    if row.prefix_spans is not None:
        return _prefix_attention_inputs(model, impl, row)
    if impl in VARLEN_IMPLEMENTATIONS:
        cu = segment_lengths_to_cu(row.lengths)
        longest = int(row.lengths.max())
        varlen = {"cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": longest, "max_length_k": longest}
        # Flash attention must get None (it would unpad with a real mask).
        return {"attention_mask": _placeholder_mask(row.input_ids.device) if impl == SEGMENT_SDPA else None, **varlen}
    if impl in MASK_IMPLEMENTATIONS:
        return {"attention_mask": block_causal_mask(row.lengths, additive_dtype=_mask_dtype(model, impl))}
    raise ValueError(f"packed forward does not support attn_implementation '{impl}'; use sdpa, eager or {sorted(VARLEN_IMPLEMENTATIONS)}")


def _prefix_attention_inputs(model: Any, impl: str, row: PackedRow) -> dict[str, Any]:
    """The shared-prompt layout as the segment kernel's keyword, or as a dense mask."""
    spans = row.prefix_spans
    assert spans is not None
    if impl == SEGMENT_SDPA:
        # No cu_seq_lens: they cannot describe the layout, and the kernel reads the spans instead.
        return {"attention_mask": _placeholder_mask(row.input_ids.device), PREFIX_SPANS_KWARG: spans}
    if impl in MASK_IMPLEMENTATIONS:
        mask = prefix_causal_mask(spans, additive_dtype=_mask_dtype(model, impl), device=row.input_ids.device)
        return {"attention_mask": mask}
    raise ValueError(f"shared-prompt packing does not support attn_implementation '{impl}'; use {sorted(PREFIX_IMPLEMENTATIONS)}")


@dataclass(frozen=True)
class _RowTargets:
    keep: torch.Tensor  # [K] positions inside the row whose outputs are needed
    targets: torch.Tensor  # [K] next-token ids
    out_index: torch.Tensor  # [K] index into the flattened [B*T] output


def _row_targets(row: PackedRow, wanted: torch.Tensor, input_ids: torch.Tensor, response_length: int) -> _RowTargets:
    """Wanted padded positions this row computes -> packed positions to keep (repeated when several
    rows share a prompt's last token), their targets and output slots."""
    width = input_ids.shape[1]
    hit = wanted.reshape(-1)[row.source_flat].nonzero().squeeze(-1)
    keep = row.source_packed[hit]
    flat = row.source_flat[hit]
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
    share_prompt: bool = False,
) -> LogProbOutput:
    """Log-probs (and entropy) [B, T] of the response tokens under a causal LM. ``share_prompt``
    (packed only) computes each distinct prompt once per packed row; same results."""
    if not use_remove_padding:
        return _padded_log_probs(
            model, input_ids, attention_mask, response_length, position_ids, temperature, compute_entropy, entropy_chunk_size
        )
    wanted = response_positions(attention_mask, response_length)  # validates response_length first
    rows = pack_for_model(model, input_ids, attention_mask, response_length, position_ids, max_tokens_per_row, share_prompt)
    return _packed_log_probs(model, rows, wanted, input_ids, response_length, temperature, compute_entropy, entropy_chunk_size)


def _padded_log_probs(
    model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, response_length: int,
    position_ids: torch.Tensor | None, temperature: float, compute_entropy: bool, chunk: int | None,
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
    model: Any, rows: list[PackedRow], wanted: torch.Tensor, input_ids: torch.Tensor, response_length: int,
    temperature: float, compute_entropy: bool, chunk: int | None,
) -> LogProbOutput:  # fmt: skip
    logps, ents, index = [], [], []
    for row in rows:
        sel = _row_targets(row, wanted, input_ids, response_length)
        if sel.keep.numel() == 0:
            continue
        # keep may repeat a position (a shared prompt's last token): logits_to_keep indexes
        # hidden[:, keep], so each copy gets its own target and its own gradient path.
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


def _token_values(value_model: Any, input_ids: torch.Tensor, **inputs: Any) -> torch.Tensor:
    """[B, S] float32 values from a one-label token classifier (or its DDP/FSDP/DeepSpeed wrapper:
    called as a whole so the wrapper's hooks run)."""
    logits = value_model(input_ids=input_ids, use_cache=False, **inputs).logits
    return logits[..., 0].float()


def compute_values(
    value_model: Any,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    *,
    position_ids: torch.Tensor | None = None,
    use_remove_padding: bool = True,
    max_tokens_per_row: int | None = None,
    share_prompt: bool = False,
) -> torch.Tensor:
    """Values [B, T] (float32) of the states before each response token, for a critic loaded by
    :func:`~alignctl.models.loading.load_value_model` (``*ForTokenClassification``, one label).
    ``share_prompt`` as in :func:`compute_log_probs` (the value before resp_i's first token is read
    at the shared prompt's last token)."""
    wanted = response_positions(attention_mask, response_length)
    batch, t = input_ids.shape[0], response_length
    if not use_remove_padding:
        if position_ids is None:
            position_ids = position_ids_from_mask(attention_mask)
        values = _token_values(value_model, input_ids, attention_mask=attention_mask, position_ids=position_ids)
        values = values[:, -t - 1 : -1]
        return values * wanted[:, -t - 1 : -1].to(values.dtype)
    vals, index = [], []
    for row in pack_for_model(value_model, input_ids, attention_mask, t, position_ids, max_tokens_per_row, share_prompt):
        sel = _row_targets(row, wanted, input_ids, response_length)
        if sel.keep.numel() == 0:
            continue
        kwargs = attention_inputs(value_model, row)
        row_values = _token_values(value_model, row.input_ids, position_ids=row.position_ids, **kwargs)[0]
        vals.append(row_values[sel.keep])
        index.append(sel.out_index)
    if not index:
        return torch.zeros(batch, t, device=input_ids.device)
    return _scatter(vals, index, batch, t)
