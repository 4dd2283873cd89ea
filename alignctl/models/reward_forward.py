"""Reward-model scores read at each sequence's last token, with a prompt shared by several
sequences computed once.

A reward model's batch usually holds several replies to one prompt: train-rm's chosen and rejected
answers, eval's policy and reference answers. Under causal attention a prompt's hidden states do
not depend on what follows it, so computing them once per group is the same math for less work
(on the quickstart's pairs the prompt is about two thirds of each sequence). Each sequence is split
into its prompt (the first ``prompt_lengths[i]`` tokens) and its reply, laid out as RL batches are
(``[left-padded prompt | right-padded reply]``), and packed by
:func:`alignctl.models.forward.pack_for_model` with ``share_prompt``: sequences whose prompts are
identical token for token share one copy, each reply attends to it and to itself only. The score
head then reads the hidden state of each sequence's last token, as
:func:`alignctl.models.loading.score_last_token` does on the padded batch.

Attention must be able to express the layout (``alignctl_segment_sdpa``, ``sdpa`` or ``eager``);
with flash attention the packing falls back to one segment per sequence (the same numbers, no
sharing). Everything is differentiable: train-rm trains through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from functools import cache
from typing import Any

import torch

from alignctl.models.forward import attention_inputs, pack_for_model, pack_padded
from alignctl.models.loading import last_token_index, position_ids_from_mask, score_last_token

__all__ = ["attended_rows", "common_prefix_length", "forward_from_scores", "group_prompt_lengths", "pair_prompt_lengths", "reply_layout",
           "score_padded", "score_shared_prompts", "token_scores_shared_prompts", "use_last_token_forward",
           "use_shared_prompt_forward", "use_token_scores_forward"]


@cache
def _token_scores_output() -> type:
    """transformers' classifier output with a ``token_scores`` field ([B, S]), made on first use
    (transformers is imported only by the functions that need it)."""
    from dataclasses import dataclass

    from transformers.modeling_outputs import SequenceClassifierOutputWithPast

    @dataclass
    class TokenScoresOutput(SequenceClassifierOutputWithPast):
        token_scores: torch.Tensor | None = None

    return TokenScoresOutput


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens ``a`` and ``b`` share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def pair_prompt_lengths(sequences: Sequence[Sequence[int]]) -> list[int]:
    """Prompt lengths for a batch ordered ``[first_1..first_B, second_1..second_B]`` (TRL's
    reward collator: chosen, then rejected): sequence i and i + B share their common prefix, less
    what would leave either of them without a token after it (the one its score is read at). An odd batch
    shares nothing (every prompt length 0: plain packing)."""
    count = len(sequences)
    if count % 2:
        return [0] * count
    half = count // 2
    # Capped by both sequences, so the two keep one and the same prompt (and share it).
    shared = [min(common_prefix_length(a, b), len(a) - 1, len(b) - 1)
              for a, b in zip(sequences[:half], sequences[half:])]
    return [*shared, *shared]


def group_prompt_lengths(groups: Sequence[Sequence[Sequence[int]]]) -> list[int]:
    """One prompt length per sequence, groups flattened in order: the prefix every member of a
    group shares, less what would leave any member without a token after it. A group of one
    shares nothing (0)."""
    lengths: list[int] = []
    for group in groups:
        if len(group) < 2:
            lengths.extend(0 for _ in group)
            continue
        first = group[0]
        shared = min(min(common_prefix_length(first, seq), len(seq) - 1) for seq in group)
        lengths.extend(shared for _ in group)
    return lengths


def reply_layout(sequences: Sequence[Sequence[int]], prompt_lengths: Sequence[int],
                 pad_id: int) -> tuple[torch.Tensor, torch.Tensor, int]:
    """``[left-padded prompt | right-padded reply]`` rows: (input_ids [N, P+T], attention_mask,
    T), the layout :func:`~alignctl.models.forward.pack_for_model` takes."""
    if len(sequences) != len(prompt_lengths):
        raise ValueError(f"{len(sequences)} sequences but {len(prompt_lengths)} prompt lengths")
    for seq, n in zip(sequences, prompt_lengths):
        if not 0 <= n < len(seq):
            raise ValueError(f"a prompt length of {n} leaves no reply token in a sequence of {len(seq)}")
    width_p = max(prompt_lengths)
    width_t = max(len(s) - n for s, n in zip(sequences, prompt_lengths))
    ids = torch.full((len(sequences), width_p + width_t), pad_id, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for row, (seq, n) in enumerate(zip(sequences, prompt_lengths)):
        tokens = torch.as_tensor(list(seq), dtype=torch.long)
        ids[row, width_p - n:width_p + len(seq) - n] = tokens
        mask[row, width_p - n:width_p + len(seq) - n] = 1
    return ids, mask, width_t


def _packed_hidden(model: Any, ids: torch.Tensor, mask: torch.Tensor, width_t: int, share: bool,
                   max_tokens_per_row: int | None) -> Iterator[tuple[Any, torch.Tensor]]:
    """(packed row, its last hidden states [N, H]) for each packed row of the ``reply_layout`` batch."""
    positions = position_ids_from_mask(mask)
    if share:
        rows = pack_for_model(model, ids, mask, width_t, positions, max_tokens_per_row, share_prompt=True)
    else:  # nothing shared: one packed segment per sequence
        rows = pack_padded(ids, mask, positions, max_tokens_per_row)
    for row in rows:
        hidden = model.base_model(input_ids=row.input_ids, position_ids=row.position_ids, use_cache=False,
                                  **attention_inputs(model, row)).last_hidden_state[0]
        yield row, hidden


def score_shared_prompts(model: Any, sequences: Sequence[Sequence[int]], prompt_lengths: Sequence[int], pad_id: int,
                         max_tokens_per_row: int | None = None) -> torch.Tensor:
    """Scores [N] (float32) of a ``*ForSequenceClassification`` reward model (one label), each
    read at its sequence's last token, with identical prompts computed once (module docstring).
    ``max_tokens_per_row`` bounds a packed row (a dense ``sdpa`` mask grows with its square)."""
    device = next(model.parameters()).device
    ids, mask, width_t = reply_layout(sequences, prompt_lengths, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    width = ids.shape[1]
    last_flat = torch.arange(len(sequences), device=device) * width + last_token_index(mask)
    scores: list[torch.Tensor] = []
    index: list[torch.Tensor] = []
    for row, hidden in _packed_hidden(model, ids, mask, width_t, max(prompt_lengths) > 0, max_tokens_per_row):
        lookup = torch.full((ids.numel(),), -1, dtype=torch.long, device=device)
        lookup[row.source_flat] = row.source_packed
        packed = lookup[last_flat]
        mine = (packed >= 0).nonzero().squeeze(-1)
        scores.append(model.score(hidden[packed[mine]]).squeeze(-1).float())
        index.append(mine)
    return torch.zeros(len(sequences), device=device).index_copy(0, torch.cat(index), torch.cat(scores))


def token_scores_shared_prompts(model: Any, sequences: Sequence[Sequence[int]], prompt_lengths: Sequence[int],
                                pad_id: int, max_tokens_per_row: int | None = None) -> list[torch.Tensor]:
    """The score head read at every token: one float32 tensor [len(sequence)] per sequence, in
    token order (its last entry is what :func:`score_shared_prompts` returns), with identical
    prompts computed once. Differentiable: train-rm's ``loss: on_track`` trains through it."""
    device = next(model.parameters()).device
    ids, mask, width_t = reply_layout(sequences, prompt_lengths, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    flat = torch.zeros(ids.numel(), device=device)
    for row, hidden in _packed_hidden(model, ids, mask, width_t, max(prompt_lengths) > 0, max_tokens_per_row):
        flat = flat.index_copy(0, row.source_flat, model.score(hidden[row.source_packed]).squeeze(-1).float())
    width_p = ids.shape[1] - width_t
    grid = flat.view(ids.shape)
    return [grid[i, width_p - n:width_p - n + len(seq)] for i, (seq, n) in enumerate(zip(sequences, prompt_lengths))]


def score_padded(model: Any, sequences: Sequence[Sequence[int]], pad_id: int) -> torch.Tensor:
    """Scores [N] (float32) of the same sequences as one right-padded batch, nothing packed or
    shared: the layout for a GPU without flash-attn, where plain sdpa on padded rows beats the
    segment kernel (:func:`alignctl.models.attention.resolve_packing`)."""
    device = next(model.parameters()).device
    ids, mask, _ = reply_layout(sequences, [0] * len(sequences), pad_id)
    return score_last_token(model, ids.to(device), mask.to(device))


def attended_rows(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """The attended token ids of each row of a padded batch (either side)."""
    return [row[keep].tolist() for row, keep in zip(input_ids, attention_mask.bool())]


def use_shared_prompt_forward(model: Any, pad_id: int, max_tokens_per_row: int | None = None) -> None:
    """Make ``model(input_ids, attention_mask)`` of a reward model return its scores through
    :func:`score_shared_prompts`, each sequence sharing its common prefix with its partner in TRL's
    ``[chosen..., rejected...]`` batch order (:func:`pair_prompt_lengths`; any other order is
    still scored exactly, only with less sharing). Patched on the instance, as a bound method so
    accelerate's mixed-precision wrapper wraps it like the class's own forward; parameter names and
    the saved folder are unchanged."""

    def scores(self: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        sequences = attended_rows(input_ids, attention_mask)
        return score_shared_prompts(self, sequences, pair_prompt_lengths(sequences), pad_id, max_tokens_per_row)

    forward_from_scores(model, scores)


def use_token_scores_forward(model: Any, pad_id: int, *, share: bool, max_tokens_per_row: int | None = None) -> None:
    """Make ``model(input_ids, attention_mask)`` of a reward model return, besides its scores at each
    row's last attended token (``logits`` [B, 1]), the score head read at every position
    (``token_scores`` [B, S], the input's layout, 0 at pads): what train-rm's ``loss: on_track`` trains.
    With ``share`` each pair in TRL's ``[chosen..., rejected...]`` order computes its common prefix once
    (:func:`token_scores_shared_prompts`). Patched on the instance like :func:`use_shared_prompt_forward`,
    so mixed precision wraps it."""
    import types

    def forward(self: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> Any:
        if share:
            keep = attention_mask.bool()
            sequences = [row[k].tolist() for row, k in zip(input_ids, keep)]
            per_sequence = token_scores_shared_prompts(self, sequences, pair_prompt_lengths(sequences), pad_id,
                                                       max_tokens_per_row)
            grid = torch.zeros(input_ids.shape, dtype=torch.float32, device=input_ids.device)
            grid = grid.masked_scatter(keep, torch.cat(per_sequence))  # row-major: each row's tokens in order
        else:  # the padded batch as given (a GPU without flash-attn: resolve_share_prompt)
            hidden = self.base_model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                                     position_ids=position_ids_from_mask(attention_mask)).last_hidden_state
            grid = self.score(hidden).squeeze(-1).float() * attention_mask
        last = grid[torch.arange(grid.shape[0], device=grid.device), last_token_index(attention_mask)]
        return _token_scores_output()(logits=last[:, None], token_scores=grid)

    model.forward = types.MethodType(forward, model)


def use_last_token_forward(model: Any) -> None:
    """Make ``model(input_ids, attention_mask)`` of a reward model read its score at each row's last
    attended token (:func:`~alignctl.models.loading.score_last_token`) on the padded batch as given,
    instead of transformers' own pooling, which takes the last token that is not ``pad_token_id``.
    Where pad == eos and a sequence ends with eos (Llama-3-style templates, TRL's appended eos on
    plain text) that pooling reads the token before the eos, while eval's and PPO's scorers and the
    shared-prompt forward read the eos itself: a reward model trained padded would be scored at a
    position it never trained. Patched on the instance like :func:`use_shared_prompt_forward`."""
    forward_from_scores(model, score_last_token)


def forward_from_scores(model: Any, scores: Callable[[Any, torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """Replace ``model.forward`` on the instance by ``scores(model, input_ids, attention_mask)`` [B]
    wrapped as transformers' classifier output, as a bound method (accelerate's mixed-precision
    wrapper wraps it like the class's own forward)."""
    import types

    from transformers.modeling_outputs import SequenceClassifierOutputWithPast

    def forward(self: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, **_: Any) -> Any:
        return SequenceClassifierOutputWithPast(logits=scores(self, input_ids, attention_mask)[:, None])

    model.forward = types.MethodType(forward, model)
