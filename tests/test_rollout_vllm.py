"""The ``vllm`` engine: output packing always; the engine itself only where vllm and CUDA exist.

The engine tests compare vLLM's greedy output with the ``hf`` engine on the same tiny float32 model
saved to disk, and check sleep / wake / weight sync. They skip (with the reason) on this CPU-only
machine; the engine is written against vLLM 0.8-0.11 and untested here.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from alignctl.errors import UserError
from alignctl.rollout import SamplingParams, get_rollout_engine
from alignctl.rollout.base import RolloutOutput


def test_from_ragged_packs_prompt_major_rows() -> None:
    out = RolloutOutput.from_ragged(
        responses=[[5, 2], [7, 8, 9], [4], [6, 6]],
        log_probs=[[-0.5, -1.0], [-0.1, -0.2, -0.3], [-2.0], [-0.25, -0.75]],
        finish_reason=["stop", "length", "stop", "length"],
        n=2,
        pad_token_id=0,
    )
    assert out.prompt_index.tolist() == [0, 0, 1, 1]
    assert out.sample_index.tolist() == [0, 1, 0, 1]
    assert out.response_ids.tolist() == [[5, 2, 0], [7, 8, 9], [4, 0, 0], [6, 6, 0]]
    assert out.response_mask.tolist() == [[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]
    assert out.response_lengths.tolist() == [2, 3, 1, 2]
    expected = torch.tensor([[-0.5, -1.0, 0.0], [-0.1, -0.2, -0.3], [-2.0, 0.0, 0.0], [-0.25, -0.75, 0.0]])
    assert torch.equal(out.log_probs, expected)
    assert out.finish_reason == ["stop", "length", "stop", "length"]
    assert out.responses() == [[5, 2], [7, 8, 9], [4], [6, 6]]


def test_from_ragged_rejects_bad_shapes_and_reasons() -> None:
    with pytest.raises(ValueError, match="multiple of n=2"):
        RolloutOutput.from_ragged([[1], [2], [3]], None, ["stop"] * 3, n=2, pad_token_id=0)
    with pytest.raises(ValueError, match="'abort'"):
        RolloutOutput.from_ragged([[1]], None, ["abort"], n=1, pad_token_id=0)


def _vllm_skip_reason() -> str | None:
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (optional extra alignctl[vllm])"
    if not torch.cuda.is_available():
        return "vllm needs CUDA; none available"
    return None


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_engine_without_vllm_is_a_user_error() -> None:
    with pytest.raises(UserError, match="alignctl\\[vllm\\]"):
        get_rollout_engine("vllm", model_path="/nonexistent")


@pytest.fixture(scope="module")
def saved_tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, LlamaForCausalLM]:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=128, vocab_size=256, pad_token_id=0, eos_token_id=2, bos_token_id=1,
                         max_position_embeddings=256)
    model = LlamaForCausalLM(config)
    path = tmp_path_factory.mktemp("tiny_llama")
    model.save_pretrained(path)
    return path, model


@pytest.mark.skipif(_vllm_skip_reason() is not None, reason=str(_vllm_skip_reason()))
def test_vllm_greedy_matches_hf_engine_and_survives_sleep_and_sync(
    saved_tiny_llama: tuple[Path, LlamaForCausalLM],
) -> None:
    path, model = saved_tiny_llama
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [20]]
    params = SamplingParams(n=2, greedy=True, max_new_tokens=12)
    vllm_engine = get_rollout_engine("vllm", model_path=str(path), dtype="float32", gpu_memory_utilization=0.2,
                                     enforce_eager=True, skip_tokenizer_init=True, pad_token_id=0)
    hf_out = get_rollout_engine("hf", model=model.cuda()).generate(prompts, params)
    v_out = vllm_engine.generate(prompts, params)
    assert torch.equal(v_out.response_ids, hf_out.response_ids)
    assert torch.allclose(v_out.log_probs, hf_out.log_probs, atol=1e-3)
    vllm_engine.sleep()
    with torch.no_grad():
        model.lm_head.weight.neg_()  # a different policy: greedy picks change
    vllm_engine.sync_weights(model)
    expected = get_rollout_engine("hf", model=model).generate(prompts, params)
    assert not torch.equal(expected.response_ids, hf_out.response_ids)
    assert torch.equal(vllm_engine.generate(prompts, params).response_ids, expected.response_ids)
