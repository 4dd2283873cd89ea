"""FSDP2 wrap units come from the model's ``_no_split_modules`` (``models.blocks.transformer_blocks``):
every block of a Llama-style and a GPT-2-style model is its own unit, wherever the model keeps its
blocks; the name rule is only a fallback, and it warns."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, LlamaForTokenClassification

from alignctl.models.blocks import transformer_blocks


def _llama() -> nn.Module:
    cfg = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=3, num_attention_heads=2,
                      num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(cfg)


def _gpt2() -> nn.Module:
    cfg = GPT2Config(vocab_size=32, n_embd=8, n_layer=3, n_head=2, n_positions=32, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


def _expected_blocks(model: nn.Module) -> list[nn.Module]:
    return list(model.transformer.h) if isinstance(model, GPT2LMHeadModel) else list(model.model.layers)


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_every_block_is_selected_without_a_warning(build) -> None:
    model = build()
    assert sum(p.numel() for p in model.parameters()) < 5000  # tiny
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        blocks = transformer_blocks(model)
    expected = _expected_blocks(model)
    assert len(expected) == 3 and all(a is b for a, b in zip(blocks, expected, strict=True))


def test_a_critic_head_around_a_backbone_finds_the_backbone_blocks() -> None:
    cfg = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                      num_key_value_heads=2, num_labels=1)
    model = LlamaForTokenClassification(cfg)
    wrapper = nn.ModuleDict({"critic": model})  # a plain wrapper declares nothing itself
    assert [id(b) for b in transformer_blocks(wrapper)] == [id(b) for b in model.model.layers]


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(2, 2)


class _NoDeclaration(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(4, 2)
        self.decoder = nn.Module()
        self.decoder.layers = nn.ModuleList([_Block(), _Block()])


def test_fallback_to_the_name_rule_warns() -> None:
    model = _NoDeclaration()
    with pytest.warns(UserWarning, match="declares no _no_split_modules; using the ModuleList 'decoder.layers'"):
        assert list(transformer_blocks(model)) == list(model.decoder.layers)
    model._no_split_modules = ["MissingBlock"]
    with pytest.warns(UserWarning, match=r"has none of them; using the ModuleList"):
        assert len(transformer_blocks(model)) == 2
    with pytest.warns(UserWarning, match="treated as one block"):
        assert transformer_blocks(nn.Linear(2, 2)) == []


@pytest.mark.parametrize("build", [_llama, _gpt2], ids=["llama", "gpt2"])
def test_fsdp2_engine_makes_every_block_its_own_unit(build, one_process_group) -> None:
    from torch.distributed.fsdp import FSDPModule

    from alignctl.workers.strategy import FSDP2Engine

    torch.manual_seed(0)
    model = build()
    blocks = _expected_blocks(model)
    engine = FSDP2Engine(model, world_size=1)
    assert isinstance(engine.model, FSDPModule)
    assert all(isinstance(block, FSDPModule) for block in blocks)
    units = [m for m in engine.model.modules() if isinstance(m, FSDPModule)]
    assert len(units) == len(blocks) + 1  # the blocks and the root, nothing else
