"""Shared-prompt packing (``share_prompt=True``) == plain packing == padded forward.

GRPO batches hold n responses per prompt; the shared layout computes each prompt once per packed
row. Everything here is exact math, so log-probs, entropies, values and parameter gradients must
match the unshared paths to float32 rounding.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification, Qwen2Config, Qwen2ForCausalLM

from alignctl.models.attention import (
    PREFIX_SPANS_KWARG,
    SEGMENT_SDPA,
    PrefixSpan,
    block_causal_mask,
    prefix_causal_mask,
    segment_sdpa_attention,
)
from alignctl.models.forward import (
    compute_log_probs,
    compute_values,
    pack_for_model,
    pack_padded,
    pack_shared_prompts,
    prompt_groups,
)
from alignctl.models.loading import new_value_model, position_ids_from_mask

VOCAB = 64
PROMPT, RESPONSE = 6, 7
ATOL = 1e-5

# (prompt length, response lengths): groups of n=4 with an empty and a length-1 response, a
# second prompt of another length, a group of n=1, a prompt whose responses are all empty, and
# a prompt of the same length as B but other tokens (grouping is by tokens, not by length).
GROUPS = {"A": (6, [7, 0, 1, 4]), "B": (3, [5, 7, 2, 3]), "C": (5, [6]), "D": (2, [0, 0]), "E": (3, [3, 7])}
# Rows of one prompt are interleaved with the others.
ORDER = ["A", "B", "A", "C", "E", "B", "D", "A", "B", "E", "D", "B", "A"]


def llama_config(**overrides: int) -> LlamaConfig:
    # 4 query heads over 2 kv heads: grouped-query attention everywhere below.
    kwargs = dict(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip
    return LlamaConfig(**{**kwargs, **overrides})


@pytest.fixture(scope="module")
def lm() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(llama_config()).train()  # train(): the kernel's training branch (dropout 0)


@pytest.fixture(scope="module")
def critic() -> LlamaForTokenClassification:
    torch.manual_seed(1)
    model = new_value_model(llama_config()).train()
    # The default zero head would make values trivially equal; std 0.05 keeps values and their
    # gradients O(1), so an absolute float32 tolerance means the same thing as for log-probs.
    torch.nn.init.normal_(model.score.weight, std=0.05)
    torch.nn.init.normal_(model.score.bias, std=0.05)
    return model


def grpo_batch(order: list[str] = ORDER) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """[left-padded prompt (6) | right-padded response (7)] rows following ``order``."""
    torch.manual_seed(2)
    prompts = {name: torch.randint(0, VOCAB, (length,)) for name, (length, _) in GROUPS.items()}
    next_response = {name: iter(lens) for name, (_, lens) in GROUPS.items()}
    ids = torch.randint(0, VOCAB, (len(order), PROMPT + RESPONSE))  # pads hold random junk on purpose
    mask = torch.zeros_like(ids)
    for b, name in enumerate(order):
        p, r = len(prompts[name]), next(next_response[name])
        ids[b, PROMPT - p : PROMPT] = prompts[name]
        mask[b, PROMPT - p : PROMPT + r] = 1
    return ids, mask, order


def log_probs(model, ids, mask, **kwargs):  # type: ignore[no-untyped-def]
    return compute_log_probs(model, ids, mask, RESPONSE, temperature=1.3, compute_entropy=True, entropy_chunk_size=8, **kwargs)


# ---------------------------------------------------------------------------------------------
# Pure helpers


def test_prompt_groups_by_tokens_in_first_appearance_order() -> None:
    ids, mask, order = grpo_batch()
    groups = prompt_groups(ids, mask, position_ids_from_mask(mask), RESPONSE)
    expected: dict[str, list[int]] = {}
    for b, name in enumerate(order):
        expected.setdefault(name, []).append(b)
    assert groups == list(expected.values())


def test_shared_rows_layout_positions_and_mapping() -> None:
    ids, mask, order = grpo_batch()
    position_ids = position_ids_from_mask(mask) + 3  # arbitrary offsets must be copied, not recomputed
    (row,) = pack_shared_prompts(ids, mask, RESPONSE, position_ids)
    # Group A first: prompt (6 tokens) then its non-empty responses 7, 1, 4, each seeing the prompt.
    assert row.prefix_spans[:4] == (PrefixSpan(0, 6), PrefixSpan(6, 13, 0, 6), PrefixSpan(13, 14, 0, 6), PrefixSpan(14, 18, 0, 6))
    assert row.position_ids[0, :18].tolist() == [*range(3, 9), *range(9, 16), 9, *range(9, 13)]
    # Group D (all responses empty) is left out; every other real token is computed somewhere.
    flat_pos = position_ids.reshape(-1)
    assert torch.equal(row.position_ids[0, row.source_packed], flat_pos[row.source_flat])
    assert torch.equal(row.input_ids[0, row.source_packed], ids.reshape(-1)[row.source_flat])
    covered = set(row.source_flat.tolist())
    real = mask.reshape(-1).nonzero().squeeze(-1).tolist()
    missing = {i // ids.shape[1] for i in real if i not in covered}
    assert missing == {b for b, name in enumerate(order) if name == "D"}


def test_budget_splits_between_groups_only() -> None:
    ids, mask, order = grpo_batch()
    # Group sizes: A 6+12=18, B 3+17=20, C 11, E 13 (D dropped). Budget 24: A | B | C+E; A and B
    # would not fit together; with 15 the groups over budget (A, B) still get a row each.
    for budget, expected in [(24, [["A"], ["B"], ["C", "E"]]), (15, [["A"], ["B"], ["C"], ["E"]])]:
        rows = pack_shared_prompts(ids, mask, RESPONSE, max_tokens_per_row=budget)
        names = [sorted({order[b] for b in (r.source_flat // ids.shape[1]).tolist()}) for r in rows]
        assert names == expected
        for row, groups in zip(rows, names):
            assert row.input_ids.shape[1] <= budget or len(groups) == 1


def test_prefix_causal_mask_hand_written() -> None:
    # prompt of 2, responses of 2 and 1 seeing it, then an unrelated sequence of 1.
    spans = (PrefixSpan(0, 2), PrefixSpan(2, 4, 0, 2), PrefixSpan(4, 5, 0, 2), PrefixSpan(5, 6))
    expected = torch.tensor(
        [[1, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0],
         [1, 1, 1, 0, 0, 0],
         [1, 1, 1, 1, 0, 0],
         [1, 1, 0, 0, 1, 0],
         [0, 0, 0, 0, 0, 1]]
    )  # fmt: skip
    assert torch.equal(prefix_causal_mask(spans)[0, 0].int(), expected)
    additive = prefix_causal_mask(spans, additive_dtype=torch.float32)[0, 0]
    assert additive[4, 1] == 0 and additive[4, 3] == torch.finfo(torch.float32).min
    plain = (PrefixSpan(0, 2), PrefixSpan(2, 3), PrefixSpan(3, 6))
    assert torch.equal(prefix_causal_mask(plain), block_causal_mask(torch.tensor([2, 1, 3])))
    with pytest.raises(ValueError):
        prefix_causal_mask((PrefixSpan(0, 2), PrefixSpan(3, 4)))  # gap: spans must tile the row


# Prompts with responses and a plain sequence; and a row head (3 tokens) seen by prompt rests and
# responses, one response seeing the head alone.
KERNEL_LAYOUTS = {
    "prompts": (PrefixSpan(0, 5), PrefixSpan(5, 8, 0, 5), PrefixSpan(8, 9, 0, 5), PrefixSpan(9, 11),
                PrefixSpan(11, 15, 9, 11)),
    "row-head": (PrefixSpan(0, 3), PrefixSpan(3, 5, head_end=3), PrefixSpan(5, 8, 3, 5, 0, 3),
                 PrefixSpan(8, 9, head_end=3), PrefixSpan(9, 11, 8, 9, 0, 3), PrefixSpan(11, 13, 8, 8, 0, 3)),
}


@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("layout", sorted(KERNEL_LAYOUTS))
def test_segment_kernel_equals_dense_mask(kv_heads: int, layout: str) -> None:
    """Lower-right causal alignment (Lq != Lk) and GQA, straight against masked sdpa."""
    torch.manual_seed(5)
    spans = KERNEL_LAYOUTS[layout]
    n = spans[-1].end
    q = torch.randn(1, 4, n, 8)
    k, v = torch.randn(1, kv_heads, n, 8), torch.randn(1, kv_heads, n, 8)
    module = torch.nn.Module().eval()
    got, _ = segment_sdpa_attention(module, q, k, v, None, scaling=0.3, **{PREFIX_SPANS_KWARG: spans})
    mask = prefix_causal_mask(spans)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3, enable_gqa=kv_heads != 4).transpose(1, 2)
    torch.testing.assert_close(got, want, atol=1e-6, rtol=0)


def test_logits_to_keep_accepts_repeated_indices(lm: LlamaForCausalLM) -> None:
    lm.set_attn_implementation("sdpa")
    ids = torch.randint(0, VOCAB, (1, 6))
    keep = torch.tensor([3, 3, 0, 3])
    with torch.no_grad():
        full = lm(input_ids=ids, use_cache=False).logits
        kept = lm(input_ids=ids, use_cache=False, logits_to_keep=keep).logits
    torch.testing.assert_close(kept, full[:, keep], atol=1e-6, rtol=0)


def test_flash_attention_falls_back_to_plain_packing() -> None:
    ids, mask, _ = grpo_batch()
    fake = SimpleNamespace(config=SimpleNamespace(_attn_implementation="flash_attention_2"))
    rows = pack_for_model(fake, ids, mask, RESPONSE, share_prompt=True)
    plain = pack_padded(ids, mask)
    assert all(r.prefix_spans is None for r in rows)
    assert [r.flat_index.tolist() for r in rows] == [r.flat_index.tolist() for r in plain]


# ---------------------------------------------------------------------------------------------
# Against the unshared paths


@pytest.mark.parametrize("impl", [SEGMENT_SDPA, "sdpa", "eager"])
@pytest.mark.parametrize("budget", [None, 24])
def test_shared_log_probs_equal_unshared(lm: LlamaForCausalLM, impl: str, budget: int | None) -> None:
    lm.set_attn_implementation(impl)
    ids, mask, _ = grpo_batch()
    with torch.no_grad():
        shared = log_probs(lm, ids, mask, share_prompt=True, max_tokens_per_row=budget)
        plain = log_probs(lm, ids, mask, max_tokens_per_row=budget)
        padded = log_probs(lm, ids, mask, use_remove_padding=False)
    for ref in (plain, padded):
        torch.testing.assert_close(shared.log_probs, ref.log_probs, atol=ATOL, rtol=0)
        torch.testing.assert_close(shared.entropy, ref.entropy, atol=ATOL, rtol=0)
    # Empty responses stay exactly 0; the length-1 response has exactly one entry.
    assert shared.log_probs[2].abs().sum() == 0 and shared.log_probs[6].abs().sum() == 0
    assert (shared.log_probs[7] != 0).tolist() == [True] + [False] * (RESPONSE - 1)


@pytest.mark.parametrize("impl", [SEGMENT_SDPA, "sdpa"])
def test_shared_gradients_equal_unshared(lm: LlamaForCausalLM, impl: str) -> None:
    lm.set_attn_implementation(impl)
    ids, mask, _ = grpo_batch()
    weights = torch.randn(ids.shape[0], RESPONSE, generator=torch.Generator().manual_seed(6))
    params = list(lm.parameters())

    def grads(**kwargs: object) -> tuple[torch.Tensor, ...]:
        out = log_probs(lm, ids, mask, **kwargs)
        return torch.autograd.grad((out.log_probs * weights).sum() + 0.1 * out.entropy.sum(), params)

    shared, plain = grads(share_prompt=True, max_tokens_per_row=24), grads()
    padded = grads(use_remove_padding=False)
    for (name, _), s, p, d in zip(lm.named_parameters(), shared, plain, padded):
        torch.testing.assert_close(s, p, atol=ATOL, rtol=0, msg=name)
        torch.testing.assert_close(s, d, atol=ATOL, rtol=0, msg=name)


@pytest.mark.parametrize("impl", [SEGMENT_SDPA, "sdpa", "eager"])
def test_shared_values_and_gradients_equal_unshared(critic: LlamaForTokenClassification, impl: str) -> None:
    critic.set_attn_implementation(impl)
    ids, mask, _ = grpo_batch()
    weights = torch.randn(ids.shape[0], RESPONSE, generator=torch.Generator().manual_seed(7))
    params = list(critic.parameters())
    results = []
    for kwargs in ({"share_prompt": True, "max_tokens_per_row": 15}, {}, {"use_remove_padding": False}):
        values = compute_values(critic, ids, mask, RESPONSE, **kwargs)
        results.append((values.detach(), torch.autograd.grad((values * weights).sum(), params)))
    (shared, shared_grads), *refs = results
    for values, value_grads in refs:
        torch.testing.assert_close(shared, values, atol=ATOL, rtol=0)
        for s, r in zip(shared_grads, value_grads):
            torch.testing.assert_close(s, r, atol=ATOL, rtol=0)
    assert shared[6].abs().sum() == 0  # D: no response, no values


def test_qwen2_shared_equals_unshared() -> None:
    """The spans keyword reaches the attention function through Qwen2's forward too."""
    torch.manual_seed(8)
    config = Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=64,
    )  # fmt: skip
    model = Qwen2ForCausalLM(config).eval()
    model.set_attn_implementation(SEGMENT_SDPA)
    ids, mask, _ = grpo_batch()
    with torch.no_grad():
        shared, plain = log_probs(model, ids, mask, share_prompt=True), log_probs(model, ids, mask)
    torch.testing.assert_close(shared.log_probs, plain.log_probs, atol=ATOL, rtol=0)
    torch.testing.assert_close(shared.entropy, plain.entropy, atol=ATOL, rtol=0)


def test_other_layouts_stay_exact(lm: LlamaForCausalLM) -> None:
    """Whole sequences right-padded (prompts not aligned at the response column), and rows whose
    prompt columns are all padding (an empty shared prompt): grouping is conservative, still exact."""
    lm.set_attn_implementation(SEGMENT_SDPA)
    ids, mask, _ = grpo_batch()
    right = torch.zeros_like(mask)
    for b, n in enumerate(mask.sum(1).tolist()):
        right[b, :n] = 1
        ids[b, :n] = ids[b][mask[b].bool()].clone()
    empty_prompt = mask.clone()
    empty_prompt[[1, 5], :PROMPT] = 0  # two rows of prompt B lose their prompt entirely
    for layout in (right, empty_prompt):
        with torch.no_grad():
            shared, plain = log_probs(lm, ids, layout, share_prompt=True), log_probs(lm, ids, layout)
        torch.testing.assert_close(shared.log_probs, plain.log_probs, atol=ATOL, rtol=0)
        torch.testing.assert_close(shared.entropy, plain.entropy, atol=ATOL, rtol=0)


def test_shared_row_computes_fewer_tokens(lm: LlamaForCausalLM) -> None:
    lm.set_attn_implementation(SEGMENT_SDPA)
    ids, mask, _ = grpo_batch()
    seen: list[int] = []
    hook = lm.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    try:
        with torch.no_grad():
            log_probs(lm, ids, mask, share_prompt=True)
            shared_tokens = sum(seen)
            seen.clear()
            log_probs(lm, ids, mask)
            plain_tokens = sum(seen)
    finally:
        hook.remove()
    with_responses = {name: spec for name, spec in GROUPS.items() if sum(spec[1])}
    distinct_prompts = sum(p for p, _ in with_responses.values())
    responses = sum(sum(lens) for _, lens in GROUPS.values())
    assert shared_tokens == distinct_prompts + responses == 6 + 3 + 5 + 3 + 45
    assert plain_tokens == int(mask.sum())
    assert shared_tokens < plain_tokens


def test_no_response_tokens_gives_zeros(lm: LlamaForCausalLM) -> None:
    lm.set_attn_implementation(SEGMENT_SDPA)
    ids, mask, _ = grpo_batch(["D", "D"])
    out = log_probs(lm, ids, mask, share_prompt=True)
    assert out.log_probs.abs().sum() == 0 and out.entropy.abs().sum() == 0



# ---------------------------------------------------------------------------------------------
# A head every prompt of a row shares (a chat template's system message), packed once per row

HEAD = 4
# Prompt rests after the head: "F" is the head alone (its responses see only the head).
HEAD_GROUPS = {"A": (3, [5, 0, 2]), "B": (1, [4, 3]), "C": (2, [6]), "F": (0, [3, 1])}
HEAD_ORDER = ["A", "B", "A", "C", "F", "B", "A", "F"]


def head_batch() -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Like :func:`grpo_batch`, every prompt starting with the same HEAD tokens."""
    torch.manual_seed(9)
    head = torch.randint(0, VOCAB, (HEAD,))
    # The rests start with distinct tokens, so the row's common head is exactly HEAD tokens long.
    prompts = {name: torch.cat([head, torch.tensor([i]), torch.randint(0, VOCAB, (rest - 1,))]) if rest else head
               for i, (name, (rest, _)) in enumerate(HEAD_GROUPS.items())}
    width = HEAD + max(rest for rest, _ in HEAD_GROUPS.values())
    next_response = {name: iter(lens) for name, (_, lens) in HEAD_GROUPS.items()}
    ids = torch.randint(0, VOCAB, (len(HEAD_ORDER), width + RESPONSE))
    mask = torch.zeros_like(ids)
    for b, name in enumerate(HEAD_ORDER):
        p, r = len(prompts[name]), next(next_response[name])
        ids[b, width - p : width] = prompts[name]
        mask[b, width - p : width + r] = 1
    return ids, mask, HEAD_ORDER


def test_head_layout_by_hand() -> None:
    """Head 4 tokens once, then A's rest (3) and responses 5, 2; B's rest (1) and 4, 3; C's rest (2)
    and 6; F has no rest, its responses 3, 1 see the head alone."""
    ids, mask, _ = head_batch()
    (row,) = pack_shared_prompts(ids, mask, RESPONSE)
    h = (0, 4)
    assert row.prefix_spans == (
        PrefixSpan(0, 4),
        PrefixSpan(4, 7, head_end=4), PrefixSpan(7, 12, 4, 7, *h), PrefixSpan(12, 14, 4, 7, *h),
        PrefixSpan(14, 15, head_end=4), PrefixSpan(15, 19, 14, 15, *h), PrefixSpan(19, 22, 14, 15, *h),
        PrefixSpan(22, 24, head_end=4), PrefixSpan(24, 30, 22, 24, *h),
        PrefixSpan(30, 33, 30, 30, *h), PrefixSpan(33, 34, 30, 30, *h),
    )  # fmt: skip
    # Every padded position maps to a packed token with the same id and position id.
    flat_pos = position_ids_from_mask(mask).reshape(-1)
    assert torch.equal(row.position_ids[0, row.source_packed], flat_pos[row.source_flat])
    assert torch.equal(row.input_ids[0, row.source_packed], ids.reshape(-1)[row.source_flat])
    assert row.position_ids[0, :8].tolist() == [0, 1, 2, 3, 4, 5, 6, 7]  # head, then A's rest at 4..6


def test_head_mask_hand_written() -> None:
    # head of 2; a prompt rest of 1 sees it; a response of 2 sees head + rest; a response of 1 sees the head only.
    spans = (PrefixSpan(0, 2), PrefixSpan(2, 3, head_end=2), PrefixSpan(3, 5, 2, 3, 0, 2), PrefixSpan(5, 6, head_end=2))
    expected = torch.tensor(
        [[1, 0, 0, 0, 0, 0],
         [1, 1, 0, 0, 0, 0],
         [1, 1, 1, 0, 0, 0],
         [1, 1, 1, 1, 0, 0],
         [1, 1, 1, 1, 1, 0],
         [1, 1, 0, 0, 0, 1]]
    )  # fmt: skip
    assert torch.equal(prefix_causal_mask(spans)[0, 0].int(), expected)
    with pytest.raises(ValueError, match="head first"):
        prefix_causal_mask((PrefixSpan(0, 2), PrefixSpan(2, 3), PrefixSpan(3, 4, 0, 2, 2, 3)))  # head after prefix


@pytest.mark.parametrize("impl", [SEGMENT_SDPA, "sdpa", "eager"])
def test_head_log_probs_and_gradients_equal_unshared(lm: LlamaForCausalLM, impl: str) -> None:
    lm.set_attn_implementation(impl)
    ids, mask, _ = head_batch()
    weights = torch.randn(ids.shape[0], RESPONSE, generator=torch.Generator().manual_seed(11))
    params = list(lm.parameters())

    def run(**kwargs: object) -> tuple[torch.Tensor, torch.Tensor, tuple[torch.Tensor, ...]]:
        out = log_probs(lm, ids, mask, **kwargs)
        grads = torch.autograd.grad((out.log_probs * weights).sum() + 0.1 * out.entropy.sum(), params)
        return out.log_probs.detach(), out.entropy.detach(), grads

    # budget 20: A | B+C | F, so rows of several groups (head shared) and of one group (no head) both occur
    for kwargs in ({"share_prompt": True}, {"share_prompt": True, "max_tokens_per_row": 20}):
        shared = run(**kwargs)
        for ref in (run(), run(use_remove_padding=False)):
            torch.testing.assert_close(shared[0], ref[0], atol=ATOL, rtol=0)
            torch.testing.assert_close(shared[1], ref[1], atol=ATOL, rtol=0)
            for (name, _), s, r in zip(lm.named_parameters(), shared[2], ref[2]):
                torch.testing.assert_close(s, r, atol=ATOL, rtol=0, msg=name)


def test_head_values_equal_unshared(critic: LlamaForTokenClassification) -> None:
    critic.set_attn_implementation(SEGMENT_SDPA)
    ids, mask, _ = head_batch()
    with torch.no_grad():
        shared = compute_values(critic, ids, mask, RESPONSE, share_prompt=True)
        plain = compute_values(critic, ids, mask, RESPONSE)
    torch.testing.assert_close(shared, plain, atol=ATOL, rtol=0)


def test_head_is_computed_once_per_row(lm: LlamaForCausalLM) -> None:
    """Tokens through the model, counted: head once, each prompt's rest once, every response."""
    lm.set_attn_implementation(SEGMENT_SDPA)
    ids, mask, _ = head_batch()
    seen: list[int] = []
    hook = lm.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(args[0].shape[1]))
    try:
        with torch.no_grad():
            log_probs(lm, ids, mask, share_prompt=True)
    finally:
        hook.remove()
    rests = sum(rest for rest, _ in HEAD_GROUPS.values())
    responses = sum(sum(lens) for _, lens in HEAD_GROUPS.values())
    assert seen == [HEAD + rests + responses] == [4 + 6 + 24]  # responses: A 5+2, B 4+3, C 6, F 3+1
