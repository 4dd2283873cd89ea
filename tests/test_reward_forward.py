"""Reward scores with shared prompts (alignctl/models/reward_forward.py) == each sequence scored
alone, unpadded: the same math, so scores and parameter gradients agree to float32 rounding.

The reference is the model's own ``forward`` on one unpadded sequence at a time (transformers'
sequence-classification pooling at the last token, no packing, no mask), an independent path."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForSequenceClassification

from alignctl.models.attention import SEGMENT_SDPA, register
from alignctl.models.reward_forward import (
    common_prefix_length,
    group_prompt_lengths,
    pair_prompt_lengths,
    reply_layout,
    score_padded,
    score_shared_prompts,
    token_scores_shared_prompts,
    use_shared_prompt_forward,
)

VOCAB, PAD = 50, 0
ATOL = 1e-5


def reward_model(attn: str) -> LlamaForSequenceClassification:
    register()
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         num_labels=1, pad_token_id=PAD)
    config._attn_implementation = attn
    torch.manual_seed(0)
    return LlamaForSequenceClassification(config).train()  # dropout is 0: train() only picks kernel branches


def pairs_batch() -> list[list[int]]:
    """[chosen x 3, rejected x 3] in TRL's order: a shared prompt of 7 tokens and answers that
    start alike for 2 more; a pair differing from the first reply token; a pair whose chosen is a
    prefix of its rejected (the prompt length is capped so the chosen keeps its last token)."""
    gen = torch.Generator().manual_seed(3)

    def tokens(n: int) -> list[int]:
        return torch.randint(1, VOCAB, (n,), generator=gen).tolist()

    p1, p2, p3 = tokens(7), tokens(4), tokens(5)
    common = tokens(2)
    chosen = [p1 + common + tokens(3), p2 + tokens(6), p3 + tokens(2)]
    rejected = [p1 + common + tokens(5), p2 + tokens(1), chosen[2] + tokens(3)]
    rejected[1][4] = (chosen[1][4] % (VOCAB - 1)) + 1  # make sure pair 2 differs right after the prompt
    return chosen + rejected


def alone(model: LlamaForSequenceClassification, sequences: list[list[int]]) -> torch.Tensor:
    return torch.stack([model(input_ids=torch.tensor([s])).logits[0, 0] for s in sequences])


def test_prefix_lengths_by_hand() -> None:
    assert common_prefix_length([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix_length([1, 2], [1, 2, 3]) == 2 and common_prefix_length([], [1]) == 0
    seqs = [[1, 2, 3, 4], [5, 6], [1, 2, 3, 9, 9], [5, 6, 7]]
    # pair (0, 2) shares 3 tokens; pair (1, 3) shares [5, 6], all of sequence 1: capped at 1 for both
    assert pair_prompt_lengths(seqs) == [3, 1, 3, 1]
    assert pair_prompt_lengths([[1, 2], [1, 2], [1]]) == [0, 0, 0]  # odd: no pairs


def test_reply_layout_by_hand() -> None:
    ids, mask, width = reply_layout([[1, 2, 3, 4], [5, 6, 7]], [3, 1], pad_id=0)
    assert width == 2
    assert ids.tolist() == [[1, 2, 3, 4, 0], [0, 0, 5, 6, 7]]
    assert mask.tolist() == [[1, 1, 1, 1, 0], [0, 0, 1, 1, 1]]
    with pytest.raises(ValueError, match="leaves no reply token"):
        reply_layout([[1, 2]], [2], pad_id=0)
    with pytest.raises(ValueError, match="2 sequences but 1 prompt lengths"):
        reply_layout([[1, 2], [3]], [0], pad_id=0)


@pytest.mark.parametrize("attn", ["sdpa", "eager", SEGMENT_SDPA])
def test_shared_scores_and_gradients_equal_scoring_each_sequence_alone(attn: str) -> None:
    model = reward_model(attn)
    seqs = pairs_batch()
    lengths = pair_prompt_lengths(seqs)
    assert lengths == [9, 4, 6, 9, 4, 6]  # pair 1's answers start alike (7 + 2); pair 3 capped at 7 - 1
    weights = torch.linspace(-1.0, 2.0, len(seqs))

    shared = score_shared_prompts(model, seqs, lengths, PAD)
    (shared * weights).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    reference = alone(model, seqs)
    (reference * weights).sum().backward()

    assert shared.dtype == torch.float32 and shared.shape == (len(seqs),)
    torch.testing.assert_close(shared, reference, rtol=0, atol=ATOL)
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=ATOL, msg=name)


@pytest.mark.parametrize("attn", ["sdpa", SEGMENT_SDPA])
@pytest.mark.parametrize("budget", [None, 16])
def test_token_scores_equal_the_score_head_on_each_sequence_alone(attn: str, budget: int | None) -> None:
    """Every token's score (train-rm's on-track loss reads them) == the score head applied to each
    hidden state of the sequence run alone, unpadded; the last one is score_shared_prompts' score.
    Gradients agree too."""
    model = reward_model(attn)
    seqs = pairs_batch()
    lengths = pair_prompt_lengths(seqs)
    weights = [torch.linspace(-1.0, 1.0, len(s)) for s in seqs]

    tokens = token_scores_shared_prompts(model, seqs, lengths, PAD, max_tokens_per_row=budget)
    sum((t * w).sum() for t, w in zip(tokens, weights)).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    reference = [model.score(model.base_model(input_ids=torch.tensor([s])).last_hidden_state[0]).squeeze(-1)
                 for s in seqs]
    sum((r * w).sum() for r, w in zip(reference, weights)).backward()

    assert [t.shape[0] for t in tokens] == [len(s) for s in seqs]
    for t, r in zip(tokens, reference):
        torch.testing.assert_close(t, r, rtol=0, atol=ATOL)
    with torch.no_grad():
        last = score_shared_prompts(model, seqs, lengths, PAD)
    torch.testing.assert_close(torch.stack([t[-1] for t in tokens]).detach(), last, rtol=0, atol=ATOL)
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=ATOL, msg=name)


def test_row_budget_splits_groups_and_gives_the_same_scores() -> None:
    model = reward_model(SEGMENT_SDPA).eval()
    seqs = pairs_batch()
    with torch.no_grad():
        whole = score_shared_prompts(model, seqs, pair_prompt_lengths(seqs), PAD)
        split = score_shared_prompts(model, seqs, pair_prompt_lengths(seqs), PAD, max_tokens_per_row=16)
        reference = alone(model, seqs)
    torch.testing.assert_close(whole, reference, rtol=0, atol=ATOL)
    torch.testing.assert_close(split, reference, rtol=0, atol=ATOL)


@pytest.mark.parametrize("attn", ["sdpa", SEGMENT_SDPA])
def test_pairs_sharing_a_system_head_score_and_train_like_each_sequence_alone(attn: str) -> None:
    """Every pair starts with the same 5 tokens (a chat template's system message): the packed row
    computes them once for all pairs (one model call, 5 + rests + replies tokens); scores and
    gradients still equal scoring each sequence alone."""
    model = reward_model(attn)
    head = [3, 14, 15, 9, 26]
    seqs = [head + s for s in pairs_batch()]
    lengths = pair_prompt_lengths(seqs)
    seen: list[int] = []
    hook = model.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    try:
        shared = score_shared_prompts(model, seqs, lengths, PAD)
    finally:
        hook.remove()
    half = len(seqs) // 2
    per_pair = sum(len(a) + len(b) - n for a, b, n in zip(seqs[:half], seqs[half:], lengths))
    assert seen == [per_pair - (half - 1) * len(head)]
    (shared * torch.linspace(-1.0, 2.0, len(seqs))).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    reference = alone(model, seqs)
    (reference * torch.linspace(-1.0, 2.0, len(seqs))).sum().backward()
    torch.testing.assert_close(shared, reference, rtol=0, atol=ATOL)
    for name, param in model.named_parameters():
        torch.testing.assert_close(grads[name], param.grad, rtol=1e-4, atol=ATOL, msg=name)


@pytest.mark.parametrize("attn", ["sdpa", SEGMENT_SDPA])
def test_groups_of_one_and_nothing_shared_score_like_each_sequence_alone(attn: str) -> None:
    """group_prompt_lengths: a group of three replies shares its common start, a group of one
    shares nothing (prompt length 0) beside it; a batch where nothing is shared at all; and the
    same batch right-padded (score_padded)."""
    model = reward_model(attn).eval()
    seqs = pairs_batch()
    groups = [[seqs[0], seqs[3], seqs[2]], [seqs[1]], [seqs[4]]]
    lengths = group_prompt_lengths(groups)
    assert lengths == [0, 0, 0, 0, 0]  # seqs[2]'s prompt differs from seqs[0]'s: nothing in common
    groups = [[seqs[0], seqs[3]], [seqs[1]], [seqs[2], seqs[5]], [seqs[4]]]
    lengths = group_prompt_lengths(groups)
    assert lengths == [9, 9, 0, 6, 6, 0]
    flat = [s for g in groups for s in g]
    with torch.no_grad():
        reference = alone(model, flat)
        torch.testing.assert_close(score_shared_prompts(model, flat, lengths, PAD), reference, rtol=0, atol=ATOL)
        torch.testing.assert_close(score_shared_prompts(model, flat, [0] * len(flat), PAD), reference, rtol=0, atol=ATOL)
        # the layout for a GPU without flash-attn: one right-padded batch, nothing packed
        torch.testing.assert_close(score_padded(model, flat, PAD), reference, rtol=0, atol=ATOL)


def test_patched_forward_scores_a_right_padded_trl_batch() -> None:
    """use_shared_prompt_forward: ``model(input_ids, attention_mask)`` on a right-padded batch (as
    TRL's reward collator builds it, an extra key such as 'margin' included) gives each row's own
    score in ``logits [N, 1]``."""
    model = reward_model(SEGMENT_SDPA).eval()
    seqs = pairs_batch()
    with torch.no_grad():
        reference = alone(model, seqs)
    width = max(map(len, seqs))
    ids = torch.full((len(seqs), width), PAD)
    mask = torch.zeros_like(ids)
    for row, seq in enumerate(seqs):
        ids[row, :len(seq)] = torch.tensor(seq)
        mask[row, :len(seq)] = 1
    use_shared_prompt_forward(model, PAD)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, use_cache=False, margin=torch.zeros(3))
    assert out.logits.shape == (len(seqs), 1)
    torch.testing.assert_close(out.logits[:, 0], reference, rtol=0, atol=ATOL)
