"""Packing engine outputs (every engine's), and the vllm engine's refusal where vLLM is missing.

The engine itself is tested in tests/test_vllm_engine.py and tests/test_vllm_rl.py, which run in
.venv-vllm (``pytest -m vllm``).
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from alignctl.errors import UserError
from alignctl.rollout import get_rollout_engine
from alignctl.rollout.engine import RolloutOutput


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


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_engine_without_vllm_is_a_user_error() -> None:
    with pytest.raises(UserError, match="alignctl\\[vllm\\]"):
        get_rollout_engine("vllm", model_path="/nonexistent")
