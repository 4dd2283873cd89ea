"""alignctl calls transformers under the current names and the pre-5.24 ones (models/compat.py).

A deprecation warning printed by a worker breaks the CLI's one-line error contract (CI failed
that way when transformers 5.24 renamed ``past_key_values`` to ``cache``), so these tests turn
FutureWarning and DeprecationWarning into errors around the calls alignctl makes.
"""

from __future__ import annotations

import inspect
import warnings
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from alignctl.models.compat import cache_kwargs, chat_token_ids, enable_activation_checkpointing
from alignctl.rollout import SamplingParams
from alignctl.rollout.hf_engine import HFRolloutEngine


def _tiny_llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         intermediate_size=64, vocab_size=64, pad_token_id=0, eos_token_id=2, bos_token_id=1)
    return LlamaForCausalLM(config)


class _OldNames(nn.Module):
    def forward(self, input_ids: Any, past_key_values: Any = None, use_cache: bool = False) -> None: ...


class _NewNames(nn.Module):
    def forward(self, input_ids: Any, cache: Any = None, use_cache: bool = False) -> None: ...


def test_the_cache_goes_under_the_name_the_model_declares() -> None:
    marker = object()
    assert cache_kwargs(_OldNames(), marker) == {"past_key_values": marker, "use_cache": True}
    assert cache_kwargs(_NewNames(), marker) == {"cache": marker, "use_cache": True}


def test_wrappers_pass_the_cache_under_the_inner_models_name() -> None:
    from peft import LoraConfig

    from alignctl.workers.model_setup import add_lora

    inner_name = "cache" if "cache" in inspect.signature(LlamaForCausalLM.forward).parameters else "past_key_values"
    lora = add_lora(_tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"]))
    marker = object()
    assert cache_kwargs(lora, marker) == {inner_name: marker, "use_cache": True}
    wrapped = nn.Module()
    wrapped.module = _OldNames()  # the DDP layout: the real model under .module
    assert cache_kwargs(wrapped, marker) == {"past_key_values": marker, "use_cache": True}


def test_rollout_on_the_installed_transformers_warns_nothing() -> None:
    model = _tiny_llama()
    engine = HFRolloutEngine(model)
    params = SamplingParams(n=2, greedy=True, max_new_tokens=6)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        out = engine.generate([[5, 6, 7], [9, 10]], params)
    # reference: transformers' own greedy generate of the first (unpadded) prompt
    reference = model.generate(input_ids=torch.tensor([[5, 6, 7]]), attention_mask=torch.ones(1, 3, dtype=torch.long),
                               do_sample=False, max_new_tokens=6, pad_token_id=0, eos_token_id=2)[0, 3:]
    assert out.response_ids[0, : len(reference)].tolist() == reference.tolist()


def test_activation_checkpointing_is_on_silently_and_keeps_the_gradients() -> None:
    ids = torch.tensor([[3, 4, 5, 6, 7, 8]])
    plain, checkpointed = _tiny_llama().train(), _tiny_llama().train()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        warnings.simplefilter("error", DeprecationWarning)
        enable_activation_checkpointing(checkpointed)
    blocks = checkpointed.model.layers
    assert all(getattr(block, "gradient_checkpointing", False) for block in blocks), "checkpointing not enabled"
    for model in (plain, checkpointed):
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
    for (name, a), (_, b) in zip(plain.named_parameters(), checkpointed.named_parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6, msg=name)


def test_chat_token_ids_are_the_ids_of_the_rendered_conversation() -> None:
    from alignctl.models.tiny import train_char_tokenizer, wrap_tokenizer

    tokenizer = wrap_tokenizer(train_char_tokenizer(["What is 2 + 3? #### 5 user assistant system"]))
    messages = [{"role": "user", "content": "What is 2 + 3?"}, {"role": "assistant", "content": "#### 5"}]
    # Reference: render the template to text, then encode that text (the template writes its own specials).
    for conversation, kwargs in ((messages, {}), (messages[:1], {"add_generation_prompt": True})):
        text = tokenizer.apply_chat_template(conversation, tokenize=False, **kwargs)
        expected = tokenizer.encode(text, add_special_tokens=False)
        got = chat_token_ids(tokenizer, conversation, **kwargs)
        assert got == expected and len(got) > len("What is 2 + 3?") and all(type(t) is int for t in got)
