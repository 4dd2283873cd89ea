"""Packed (remove-padding) forward == padded forward == an independent per-sequence reference."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

from alignctl.algos.entropy import entropy_from_logits
from alignctl.models.attention import SEGMENT_SDPA, block_causal_mask
from alignctl.models.forward import compute_log_probs, compute_values, logprobs_from_logits, pack_padded
from alignctl.models.loading import new_value_model

VOCAB = 50
PROMPT, RESPONSE = 5, 7
IMPLEMENTATIONS = ["sdpa", "eager", SEGMENT_SDPA]


def tiny_config() -> LlamaConfig:
    # 4 query heads over 2 kv heads: exercises grouped-query attention in the segment kernel.
    return LlamaConfig(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
    )  # fmt: skip


@pytest.fixture(scope="module")
def lm() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(tiny_config()).eval()


@pytest.fixture(scope="module")
def critic() -> LlamaForTokenClassification:
    torch.manual_seed(1)
    model = new_value_model(tiny_config()).eval()
    torch.nn.init.normal_(model.score.weight)  # the default zero head would make values trivially equal
    torch.nn.init.normal_(model.score.bias)
    return model


def verl_batch() -> tuple[torch.Tensor, torch.Tensor]:
    """[left-padded prompt (5) | right-padded response (7)], including a row with an empty response."""
    torch.manual_seed(2)
    prompt_lens = [5, 3, 1, 4]
    response_lens = [7, 4, 6, 0]
    ids = torch.randint(0, VOCAB, (4, PROMPT + RESPONSE))
    mask = torch.zeros_like(ids)
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        mask[b, PROMPT - p : PROMPT + r] = 1
    return ids, mask


def reference_log_probs(model: LlamaForCausalLM, ids: torch.Tensor, mask: torch.Tensor, temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Independent slow reference: each sequence alone, unpadded, no mask, full log-softmax."""
    width = ids.shape[1]
    logp = torch.zeros(ids.shape[0], RESPONSE)
    ent = torch.zeros(ids.shape[0], RESPONSE)
    for b in range(ids.shape[0]):
        cols = mask[b].nonzero().squeeze(-1).tolist()
        seq = ids[b, cols]
        with torch.no_grad():
            logits = model(seq[None]).logits[0] / temperature
        dist = torch.log_softmax(logits, -1)
        for j in range(1, len(cols)):
            t = cols[j] - (width - RESPONSE)
            if t >= 0:
                logp[b, t] = dist[j - 1, seq[j]]
                ent[b, t] = -(dist[j - 1].exp() * dist[j - 1]).sum()
    return logp, ent


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
@pytest.mark.parametrize("budget", [None, 10])
def test_packed_equals_padded_and_reference(lm: LlamaForCausalLM, impl: str, budget: int | None) -> None:
    lm.set_attn_implementation(impl)
    ids, mask = verl_batch()
    ref_logp, ref_ent = reference_log_probs(lm, ids, mask, temperature=1.5)
    with torch.no_grad():
        packed = compute_log_probs(lm, ids, mask, RESPONSE, temperature=1.5, compute_entropy=True, max_tokens_per_row=budget)
        padded = compute_log_probs(lm, ids, mask, RESPONSE, temperature=1.5, compute_entropy=True, use_remove_padding=False)
    for out in (packed, padded):
        torch.testing.assert_close(out.log_probs, ref_logp, atol=1e-5, rtol=0)
        torch.testing.assert_close(out.entropy, ref_ent, atol=1e-5, rtol=0)
    # Padding positions are exactly 0 (row 3 has no response at all).
    assert packed.log_probs[3].abs().sum() == 0 and packed.log_probs[1, 4:].abs().sum() == 0


def test_right_padded_layout(lm: LlamaForCausalLM) -> None:
    """Whole sequences right-padded (the SFT / training layout), response = last 7 columns."""
    lm.set_attn_implementation("sdpa")
    ids, _ = verl_batch()
    mask = torch.zeros_like(ids)
    for b, n in enumerate([12, 9, 8, 11]):
        mask[b, :n] = 1
    with torch.no_grad():
        packed = compute_log_probs(lm, ids, mask, RESPONSE, compute_entropy=True)
        padded = compute_log_probs(lm, ids, mask, RESPONSE, compute_entropy=True, use_remove_padding=False)
    ref_logp, ref_ent = reference_log_probs(lm, ids, mask, temperature=1.0)
    torch.testing.assert_close(packed.log_probs, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(padded.log_probs, ref_logp, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed.entropy, padded.entropy, atol=1e-5, rtol=0)


@pytest.mark.parametrize("impl", ["sdpa", SEGMENT_SDPA])
def test_gradients_packed_equal_padded(impl: str) -> None:
    torch.manual_seed(3)
    model = LlamaForCausalLM(tiny_config()).train()
    model.set_attn_implementation(impl)
    ids, mask = verl_batch()
    weights = torch.randn(ids.shape[0], RESPONSE)

    def grads(remove_padding: bool) -> dict[str, torch.Tensor]:
        model.zero_grad()
        out = compute_log_probs(model, ids, mask, RESPONSE, compute_entropy=True, use_remove_padding=remove_padding, entropy_chunk_size=4)
        ((out.log_probs * weights).sum() + 0.1 * out.entropy.sum()).backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    packed, padded = grads(True), grads(False)
    for name in padded:
        torch.testing.assert_close(packed[name], padded[name], atol=1e-6, rtol=1e-4, msg=name)


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_values_packed_equal_padded(critic: LlamaForTokenClassification, impl: str) -> None:
    critic.set_attn_implementation(impl)
    ids, mask = verl_batch()
    with torch.no_grad():
        packed = compute_values(critic, ids, mask, RESPONSE, max_tokens_per_row=12)
        padded = compute_values(critic, ids, mask, RESPONSE, use_remove_padding=False)
        # Reference for row 0 (no padding at all): values at columns 4..10 of a plain forward.
        plain = critic(ids[:1]).logits[0, PROMPT - 1 : -1, 0]
    torch.testing.assert_close(packed, padded, atol=1e-5, rtol=0)
    torch.testing.assert_close(packed[0], plain, atol=1e-5, rtol=0)
    assert packed[3].abs().sum() == 0


def test_temperature_scaling_hand_computed() -> None:
    # logits [0, 2 ln 3] / T=2 -> [0, ln 3] -> p = [1/4, 3/4]; log p(target=1) = ln(3/4).
    # entropy = -(1/4 ln 1/4 + 3/4 ln 3/4) = 0.5623351446...
    logits = torch.tensor([[0.0, 2 * math.log(3.0)]])
    logp, ent = logprobs_from_logits(logits, torch.tensor([1]), temperature=2.0, compute_entropy=True)
    assert logp.item() == pytest.approx(math.log(0.75), abs=1e-7)
    assert ent.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-7)


def test_uniform_logits_entropy_is_log_vocab() -> None:
    logp, ent = logprobs_from_logits(torch.zeros(3, 8), torch.tensor([0, 5, 7]), compute_entropy=True)
    torch.testing.assert_close(ent, torch.full((3,), math.log(8)), atol=1e-6, rtol=0)
    torch.testing.assert_close(logp, torch.full((3,), -math.log(8)), atol=1e-6, rtol=0)


def test_forward_entropy_is_the_algos_entropy() -> None:
    """One entropy in the package: the log-prob path returns exactly what algos computes, also
    for logits around 1e4 where a second formula (logsumexp - sum p z) is off by whole nats."""
    torch.manual_seed(5)
    logits = torch.cat([torch.randn(6, 50) * 3, torch.randn(2, 50) + 1e4])
    _, ent = logprobs_from_logits(logits, torch.zeros(8, dtype=torch.long), compute_entropy=True, chunk_size=3)
    assert torch.equal(ent, entropy_from_logits(logits))
    torch.testing.assert_close(ent[6:], entropy_from_logits(logits[6:].double() - 1e4).float(), atol=1e-5, rtol=0)


def test_chunked_equals_unchunked_with_gradients() -> None:
    torch.manual_seed(4)
    logits = torch.randn(37, 101, requires_grad=True)
    targets = torch.randint(0, 101, (37,))
    results = []
    for chunk in (None, 5):
        logp, ent = logprobs_from_logits(logits, targets, temperature=0.7, compute_entropy=True, chunk_size=chunk)
        (grad,) = torch.autograd.grad((logp + ent).sum(), logits)
        results.append((logp.detach(), ent.detach(), grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=0)


def test_block_causal_mask_hand_written() -> None:
    got = block_causal_mask(torch.tensor([2, 1, 2]))[0, 0].int()
    expected = torch.tensor(
        [[1, 0, 0, 0, 0],
         [1, 1, 0, 0, 0],
         [0, 0, 1, 0, 0],
         [0, 0, 0, 1, 0],
         [0, 0, 0, 1, 1]]
    )  # fmt: skip
    assert torch.equal(got, expected)
    additive = block_causal_mask(torch.tensor([1, 1]), additive_dtype=torch.float32)[0, 0]
    assert additive[1, 1] == 0 and additive[1, 0] == torch.finfo(torch.float32).min


def test_pack_padded_restarts_positions_and_respects_budget() -> None:
    ids, mask = verl_batch()  # real lengths 12, 7, 7, 4
    rows = pack_padded(ids, mask, max_tokens_per_row=14)
    assert [r.lengths.tolist() for r in rows] == [[12], [7, 7], [4]]
    assert rows[1].position_ids.tolist() == [[0, 1, 2, 3, 4, 5, 6, 0, 1, 2, 3, 4, 5, 6]]
    # Every real token appears exactly once across rows.
    flat = torch.cat([r.flat_index for r in rows])
    assert sorted(flat.tolist()) == mask.reshape(-1).nonzero().squeeze(-1).tolist()


@pytest.mark.parametrize("impl", ["sdpa", SEGMENT_SDPA])
def test_bf16_autocast_log_probs_and_values_stay_near_fp32(lm: LlamaForCausalLM, critic: LlamaForTokenClassification, impl: str) -> None:
    """trainer.precision=bf16 runs forwards under bf16 autocast: the outputs come back float32, differ
    from fp32 (the matmuls really ran in bf16: ~3 significant digits) and stay within 0.05 nats of
    the independent fp32 reference on this model, padded rows still exactly 0."""
    from alignctl.workers.batch_transfer import autocast

    lm.set_attn_implementation(impl)
    critic.set_attn_implementation(impl)
    ids, mask = verl_batch()
    ref_logp, _ = reference_log_probs(lm, ids, mask, temperature=1.0)
    with torch.no_grad(), autocast("cpu", "bf16"):
        out = compute_log_probs(lm, ids, mask, RESPONSE, compute_entropy=True)
        values = compute_values(critic, ids, mask, RESPONSE)
    with torch.no_grad():
        values_fp32 = compute_values(critic, ids, mask, RESPONSE)
    assert out.log_probs.dtype == torch.float32 and out.entropy.dtype == torch.float32
    gap = (out.log_probs - ref_logp).abs().max().item()
    assert 0 < gap < 0.05, gap
    assert 0 < (values.float() - values_fp32).abs().max().item() < 0.05 * values_fp32.abs().max().item()
    assert out.log_probs[3].abs().sum() == 0 and values[3].abs().sum() == 0
    with autocast("cpu", "fp32"):
        assert not torch.is_autocast_enabled("cpu")


def test_float32_output_head_under_bf16_autocast() -> None:
    """The LM head patched to float32 returns float32 logits under bf16 autocast (the plain head
    returns bf16), exactly the float32 product of the hidden states, and leaves parameter names alone."""
    from alignctl.workers.batch_transfer import autocast, float32_output_head

    torch.manual_seed(4)
    model = LlamaForCausalLM(tiny_config()).eval()
    names = list(model.state_dict())
    ids, _ = verl_batch()
    float32_output_head(model, "cpu")
    float32_output_head(model, "cpu")  # idempotent: patched once
    with torch.no_grad(), autocast("cpu", "bf16"):
        hidden = model.model(ids).last_hidden_state
        logits = model(ids).logits
    assert logits.dtype == torch.float32
    torch.testing.assert_close(logits, hidden.float() @ model.lm_head.weight.T, atol=1e-5, rtol=0)
    with torch.no_grad(), autocast("cpu", "bf16"):  # unpatched, the head runs in bf16
        plain = LlamaForCausalLM(tiny_config()).eval()
        plain.load_state_dict(model.state_dict())
        assert plain(ids).logits.dtype == torch.bfloat16
    assert list(model.state_dict()) == names
