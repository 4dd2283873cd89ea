"""The ``hf`` rollout engine against independent references.

References used here:
  * transformers ``model.generate(do_sample=False)`` for greedy decoding (token for token);
  * a plain full forward pass of each unpadded prompt+response for log-probs;
  * the engine's own configurations against each other (drop-immediately vs drop-never, the
    preallocated cache vs transformers' DynamicCache, sdpa vs eager attention) — all must agree.

Equality tests run the model in float64 so that batch-size-dependent kernel rounding cannot flip
an argmax tie; the log-prob test runs in float32 with the 1e-4 tolerance of the spec.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from alignctl.errors import UserError
from alignctl.rollout import ROLLOUT_ENGINES, SamplingParams, get_rollout_engine
from alignctl.rollout.hf_engine import HFRolloutEngine

PAD, EOS, VOCAB = 0, 2, 256
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [20], [30, 31, 32, 33], [40, 41], [50, 51, 52, 53, 54, 55, 56, 57]]
HEAD = [60, 61, 62, 63, 64]  # a system message every prompt starts with
HEAD_PROMPTS = [HEAD + p for p in PROMPTS]


def tiny_llama(eos_bias: float = 0.0, dtype: torch.dtype = torch.float64, attn: str = "sdpa") -> LlamaForCausalLM:
    """2-layer Llama whose lm_head has a bias so the EOS logit can be raised (random models almost
    never pick EOS on their own)."""
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=VOCAB, pad_token_id=PAD, eos_token_id=EOS,
                         bos_token_id=1, attn_implementation=attn)
    model = LlamaForCausalLM(config)
    head = nn.Linear(64, VOCAB, bias=True)
    with torch.no_grad():
        head.weight.copy_(model.lm_head.weight)
        head.bias.zero_()
        head.bias[EOS] = eos_bias
    model.lm_head = head
    return model.to(dtype)


def hf_greedy(model: LlamaForCausalLM, prompts: list[list[int]], max_new: int) -> torch.Tensor:
    """Reference: transformers generate on the left-padded batch; returns only the new tokens."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False, max_new_tokens=max_new,
                             pad_token_id=PAD, eos_token_id=EOS)
    return out[:, width:]


@pytest.fixture(scope="module")
def eos_model() -> LlamaForCausalLM:
    # bias 0.3 on this seed: greedy rows stop after 1, 3, 5, 13 tokens and one runs to the limit.
    return tiny_llama(eos_bias=0.3)


@pytest.fixture(scope="module")
def eos_model_reference(eos_model: LlamaForCausalLM) -> torch.Tensor:
    return hf_greedy(eos_model, PROMPTS, 24)


def test_greedy_matches_transformers_generate(eos_model: LlamaForCausalLM, eos_model_reference: torch.Tensor) -> None:
    out = get_rollout_engine("hf", model=eos_model).generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=24))
    lengths = out.response_lengths.tolist()
    assert len(set(lengths)) >= 3 and 24 in lengths and min(lengths) < 5, f"setup lost its EOS mix: {lengths}"
    assert out.response_ids.shape == eos_model_reference.shape
    assert torch.equal(out.response_ids, eos_model_reference)


def test_greedy_n_samples_equal_repeated_generate(
    eos_model: LlamaForCausalLM, eos_model_reference: torch.Tensor
) -> None:
    n = 3
    out = HFRolloutEngine(eos_model).generate(PROMPTS, SamplingParams(n=n, greedy=True, max_new_tokens=24))
    assert torch.equal(out.response_ids, eos_model_reference.repeat_interleave(n, 0))
    assert out.prompt_index.tolist() == [i for i in range(len(PROMPTS)) for _ in range(n)]
    assert out.sample_index.tolist() == [j for _ in PROMPTS for j in range(n)]


def test_greedy_without_padding_matches_generate(eos_model: LlamaForCausalLM) -> None:
    # equal lengths: transformers drops the mask (sdpa is_causal); the engine still passes one
    prompts = [[5, 6, 7, 8], [9, 10, 11, 12], [20, 21, 22, 23]]
    out = HFRolloutEngine(eos_model).generate(prompts, SamplingParams(greedy=True, max_new_tokens=12))
    assert torch.equal(out.response_ids, hf_greedy(eos_model, prompts, 12))


@pytest.mark.parametrize(
    "engine_kwargs",
    [{"compact_fraction": 0.0}, {"compact_fraction": 1.0}, {"preallocate_cache": False}],
    ids=["drop-immediately", "drop-when-all-done", "dynamic-cache"],
)
@pytest.mark.parametrize("prompts", [PROMPTS, HEAD_PROMPTS], ids=["plain", "shared-head"])
def test_batch_compaction_and_cache_variants_agree(eos_model: LlamaForCausalLM, engine_kwargs: dict,
                                                   prompts: list[list[int]]) -> None:
    params = SamplingParams(n=2, greedy=True, max_new_tokens=24)
    base = HFRolloutEngine(eos_model).generate(prompts, params)
    other = HFRolloutEngine(eos_model, **engine_kwargs).generate(prompts, params)
    assert torch.equal(base.response_ids, other.response_ids)
    assert torch.allclose(base.log_probs, other.log_probs, atol=1e-12, rtol=0)


def test_shared_head_length_by_hand() -> None:
    from alignctl.rollout.hf_engine import shared_head_length

    assert shared_head_length(HEAD_PROMPTS) == 5
    assert shared_head_length([HEAD + [1], HEAD]) == 4  # the shorter prompt keeps its last token
    assert shared_head_length([[1, 2, 3, 9], [1, 2, 3, 8]]) == 0  # 3 shared tokens: under the minimum of 4
    assert shared_head_length([[1, 2, 3, 9], [1, 2, 3, 8]], minimum=1) == 3
    assert shared_head_length([HEAD + [1, 2]]) == 0  # one prompt: nothing to share


def test_shared_head_prefilled_once_matches_generate(eos_model: LlamaForCausalLM) -> None:
    """Prompts with a common head: the head goes through the model once for the whole batch, and
    greedy answers equal transformers' generate on the left-padded batch; log-probs equal each prompt
    generated alone (no head sharing with one prompt)."""
    seen: list[tuple[int, int]] = []
    hook = eos_model.get_input_embeddings().register_forward_hook(lambda m, args, out: seen.append(tuple(args[0].shape)))
    params = SamplingParams(n=2, greedy=True, max_new_tokens=24)
    try:
        out = HFRolloutEngine(eos_model).generate(HEAD_PROMPTS, params)
    finally:
        hook.remove()
    rests = max(len(p) for p in PROMPTS)
    assert seen[:2] == [(1, len(HEAD)), (len(PROMPTS), rests)]  # head once, then the rests
    assert torch.equal(out.response_ids, hf_greedy(eos_model, HEAD_PROMPTS, 24).repeat_interleave(2, 0))
    for i, prompt in enumerate(HEAD_PROMPTS):
        alone = HFRolloutEngine(eos_model).generate([prompt], SamplingParams(greedy=True, max_new_tokens=24))
        n = int(alone.response_lengths[0])
        assert torch.equal(out.response_ids[2 * i, :n], alone.response_ids[0, :n])
        assert torch.allclose(out.log_probs[2 * i, :n], alone.log_probs[0, :n], atol=1e-10, rtol=0)


def test_eager_attention_path_matches_generate_and_sdpa() -> None:
    # float32: transformers' own eager path yields NaN on left-padded float64 batches.
    eager = tiny_llama(0.3, dtype=torch.float32, attn="eager")
    sdpa = tiny_llama(0.3, dtype=torch.float32, attn="sdpa")
    params = SamplingParams(greedy=True, max_new_tokens=16)
    a = HFRolloutEngine(eager).generate(PROMPTS, params)
    b = HFRolloutEngine(sdpa).generate(PROMPTS, params)
    assert torch.equal(a.response_ids, hf_greedy(eager, PROMPTS, 16))
    assert torch.equal(a.response_ids, b.response_ids)
    assert torch.allclose(a.log_probs, b.log_probs, atol=1e-5, rtol=0)


def test_eos_and_length_handling(eos_model: LlamaForCausalLM) -> None:
    max_new = 24
    out = HFRolloutEngine(eos_model).generate(PROMPTS, SamplingParams(n=1, greedy=True, max_new_tokens=max_new))
    assert set(out.finish_reason) == {"stop", "length"}
    for row, reason, length, mask in zip(out.response_ids, out.finish_reason, out.response_lengths,
                                         out.response_mask):
        length = int(length)
        kept = row[:length].tolist()
        assert EOS not in kept[:-1]  # the first EOS ends the response
        if reason == "stop":
            assert kept[-1] == EOS
        else:
            assert length == max_new and EOS not in kept
        assert mask.tolist() == [1] * length + [0] * (row.shape[0] - length)
        assert row[length:].eq(PAD).all()
    assert torch.equal(out.response_lengths, out.response_mask.sum(-1))
    assert out.log_probs[out.response_mask == 0].eq(0).all()
    assert out.log_probs[out.response_mask == 1].lt(0).all()


def test_no_stop_tokens_runs_to_max_length(eos_model: LlamaForCausalLM) -> None:
    out = HFRolloutEngine(eos_model).generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=7, stop_token_ids=()))
    assert out.response_ids.shape == (len(PROMPTS), 7)
    assert out.finish_reason == ["length"] * len(PROMPTS)
    assert out.response_lengths.tolist() == [7] * len(PROMPTS)


def test_custom_stop_token_ids(eos_model: LlamaForCausalLM) -> None:
    free = HFRolloutEngine(eos_model).generate(PROMPTS[:1], SamplingParams(greedy=True, max_new_tokens=30,
                                                                            stop_token_ids=()))
    third = int(free.response_ids[0, 2])  # stop at the third greedy token instead of EOS
    out = HFRolloutEngine(eos_model).generate(PROMPTS[:1], SamplingParams(greedy=True, max_new_tokens=30,
                                                                           stop_token_ids=(third,)))
    first_hit = free.response_ids[0].tolist().index(third) + 1
    assert out.response_lengths.tolist() == [first_hit] and out.finish_reason == ["stop"]


def recompute_log_probs(model: nn.Module, prompt: list[int], response: list[int], temperature: float) -> torch.Tensor:
    """Reference: one unpadded full forward of prompt+response; log softmax(logits / T) of each response token."""
    ids = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    return torch.log_softmax(logits / temperature, -1).gather(-1, torch.tensor(response)[:, None]).squeeze(-1)


def test_sampled_log_probs_match_full_forward_and_respect_filters() -> None:
    model = tiny_llama(eos_bias=0.5, dtype=torch.float32)  # about half the samples stop early
    params = SamplingParams(n=3, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=20, seed=3)
    out = HFRolloutEngine(model).generate(PROMPTS, params)
    assert "stop" in out.finish_reason and "length" in out.finish_reason
    for r, response in enumerate(out.responses()):
        prompt = PROMPTS[int(out.prompt_index[r])]
        ref = recompute_log_probs(model, prompt, response, temperature=0.7)
        got = out.log_probs[r, : len(response)]
        assert torch.allclose(got, ref, atol=1e-4, rtol=0), (r, (got - ref).abs().max())
        # Every sampled token survived top-k=20 and the 0.9 nucleus of the tempered distribution.
        ids = torch.tensor([prompt + response])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[0, len(prompt) - 1 : -1] / 0.7, -1)
        chosen = logp.gather(-1, torch.tensor(response)[:, None])
        rank = (logp > chosen).sum(-1)
        mass_before = torch.where(logp > chosen, logp.exp(), torch.zeros_like(logp)).sum(-1)
        assert rank.lt(20).all() and mass_before.lt(0.9).all()


def test_seeded_determinism() -> None:
    model = tiny_llama(eos_bias=0.5)
    engine = HFRolloutEngine(model)
    a = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=12, seed=7))
    b = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=12, seed=7))
    c = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=12, seed=8))
    assert torch.equal(a.response_ids, b.response_ids) and torch.equal(a.log_probs, b.log_probs)
    assert not torch.equal(a.response_ids[:, :3], c.response_ids[:, :3])
    # samples of the same prompt differ (the cache is shared, the randomness is not)
    assert not torch.equal(a.response_ids[0], a.response_ids[1])


def test_top_k_one_equals_greedy(eos_model: LlamaForCausalLM) -> None:
    engine = HFRolloutEngine(eos_model)
    greedy = engine.generate(PROMPTS, SamplingParams(n=2, greedy=True, max_new_tokens=16))
    top1 = engine.generate(PROMPTS, SamplingParams(n=2, temperature=1.0, top_k=1, max_new_tokens=16, seed=0))
    assert torch.equal(greedy.response_ids, top1.response_ids)
    # T = 1 in both, so the pre-filter log-probs agree too
    assert torch.allclose(greedy.log_probs, top1.log_probs, atol=1e-12, rtol=0)


def test_temperature_zero_is_greedy(eos_model: LlamaForCausalLM) -> None:
    engine = HFRolloutEngine(eos_model)
    greedy = engine.generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=10))
    t0 = engine.generate(PROMPTS, SamplingParams(temperature=0.0, max_new_tokens=10))
    assert torch.equal(greedy.response_ids, t0.response_ids)


def test_training_mode_restored_and_gather_hook_wraps_generation(eos_model: LlamaForCausalLM) -> None:
    events: list[str] = []

    class Hook:
        def __enter__(self) -> None:
            events.append("enter")

        def __exit__(self, *exc: object) -> None:
            events.append("exit")

    eos_model.train()
    engine = HFRolloutEngine(eos_model, gather_params=Hook)
    out = engine.generate(PROMPTS[:2], SamplingParams(greedy=True, max_new_tokens=4))
    assert events == ["enter", "exit"]
    assert eos_model.training and all(m.training for m in eos_model.modules())
    # eval mode was active inside: dropout-free result equals a run started from eval mode
    eos_model.eval()
    again = engine.generate(PROMPTS[:2], SamplingParams(greedy=True, max_new_tokens=4))
    assert not eos_model.training
    assert torch.equal(out.response_ids, again.response_ids)


def test_sync_weights_named_tensors_and_module_swap() -> None:
    model = tiny_llama(eos_bias=0.3)
    engine = HFRolloutEngine(model)
    params = SamplingParams(greedy=True, max_new_tokens=8, stop_token_ids=())
    before = engine.generate(PROMPTS, params).response_ids
    bias = torch.zeros(VOCAB, dtype=torch.float64)
    bias[77] = 50.0  # token 77 now dominates every step
    engine.sync_weights([("lm_head.bias", bias)])
    assert engine.generate(PROMPTS, params).response_ids.eq(77).all()
    engine.sync_weights(tiny_llama(eos_bias=0.3))
    assert torch.equal(engine.generate(PROMPTS, params).response_ids, before)
    with pytest.raises(KeyError, match="no_such"):
        engine.sync_weights([("no_such.weight", torch.zeros(1))])


def test_registry_and_input_validation(eos_model: LlamaForCausalLM) -> None:
    assert isinstance(get_rollout_engine("hf", model=eos_model), HFRolloutEngine)
    with pytest.raises(ValueError, match="hf, vllm"):
        get_rollout_engine("sglang")
    assert set(ROLLOUT_ENGINES) == {"hf", "vllm"}
    engine = HFRolloutEngine(eos_model)
    with pytest.raises(UserError, match="prompt 1 is empty"):
        engine.generate([[3], []], SamplingParams())
    with pytest.raises(UserError, match="outside"):
        engine.generate([[3, VOCAB]], SamplingParams())
    with pytest.raises(UserError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(UserError, match="n must be"):
        SamplingParams(n=0)
