"""The ``hf`` engine on an FSDP2-sharded training module (2 gloo processes on CPU).

Reference: the same model unsharded, generated with the same engine. With ``fsdp2_gather_params``
as the gather hook the sharded model must give identical greedy tokens and log-probs, leave its
parameters sharded afterwards, keep training mode, and still train (forward + backward).
"""

from __future__ import annotations

import copy
from pathlib import Path

import torch

from spawn_helpers import run_ranks


def _check(rank: int) -> str:
    from torch.distributed.fsdp import fully_shard
    from transformers import LlamaConfig, LlamaForCausalLM

    from alignctl.rollout import SamplingParams
    from alignctl.rollout.hf_engine import HFRolloutEngine, fsdp2_gather_params

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      intermediate_size=128, vocab_size=256, pad_token_id=0, eos_token_id=2)
    model = LlamaForCausalLM(cfg)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13, 14], [20]]
    params = SamplingParams(n=2, greedy=True, max_new_tokens=8)
    ref = HFRolloutEngine(copy.deepcopy(model)).generate(prompts, params)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    model.train()
    out = HFRolloutEngine(model, gather_params=lambda: fsdp2_gather_params(model)).generate(prompts, params)
    same = torch.equal(out.response_ids, ref.response_ids) and torch.allclose(out.log_probs, ref.log_probs,
                                                                              atol=1e-6, rtol=0)
    sharded = all(type(p).__name__ == "DTensor" for p in model.parameters())
    ids = torch.tensor([[5, 6, 7, 8]])
    model(input_ids=ids, labels=ids).loss.backward()
    grads = all(p.grad is not None for p in model.parameters())
    return f"same={same} sharded={sharded} grads={grads} training={model.training}"


def test_fsdp2_sharded_module_generates_like_unsharded(tmp_path: Path) -> None:
    # Two CI runs saw rank 0 die by SIGABRT after its check ("terminate called without an active
    # exception"), which never reproduced alone or under load: run_ranks reports that apart.
    for rank, result in enumerate(run_ranks(_check, 2, tmp_path)):
        assert result == "same=True sharded=True grads=True training=True", rank
