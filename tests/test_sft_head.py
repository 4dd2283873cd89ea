"""SFT's label-positions head (alignctl/trainers/sft_head.py) against TRL's own fused LM head.

The reference is ``trl.trainer.utils.add_fused_lm_head``'s forward, an independent implementation
(online log-sum-exp over vocabulary tiles, every position scored): loss, per-token log-probs,
entropy, top-1 hits and every parameter's gradient must agree to float32 rounding."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from trl.trainer.utils import add_fused_lm_head

from alignctl.trainers import sft_head
from alignctl.trainers.sft_head import use_label_positions_head

VOCAB = 96


def model_pair() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=True)
    torch.manual_seed(0)
    trl_model = LlamaForCausalLM(config)
    ours = LlamaForCausalLM(config)
    ours.load_state_dict(trl_model.state_dict())
    for model in (trl_model, ours):
        add_fused_lm_head(model, outputs=("log_probs", "entropy", "is_top1"))
    use_label_positions_head(ours)
    return trl_model, ours


def sft_batch() -> dict[str, torch.Tensor]:
    """3 right-padded rows; labels -100 on the prompt (first 5 tokens) and the padding."""
    gen = torch.Generator().manual_seed(1)
    ids = torch.randint(0, VOCAB, (3, 14), generator=gen)
    mask = torch.ones_like(ids)
    mask[1, 10:] = 0
    mask[2, 7:] = 0
    labels = ids.masked_fill(mask == 0, -100)
    labels[:, :5] = -100
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


@pytest.mark.parametrize("chunk", [1024, 4])  # one chunk, or checkpointed chunks of 4 label tokens
@pytest.mark.parametrize("num_items", [None, 11])
def test_outputs_and_gradients_equal_trl_fused_head(monkeypatch: pytest.MonkeyPatch, chunk: int,
                                                    num_items: int | None) -> None:
    monkeypatch.setattr(sft_head, "TOKEN_CHUNK", chunk)
    trl_model, ours = model_pair()
    batch = sft_batch()
    outs = [m(**batch, fused_lm_head=True, num_items_in_batch=num_items) for m in (trl_model, ours)]
    for out in outs:
        out.loss.backward()
    ref, got = outs
    assert int(got.label_mask.sum()) == int((batch["labels"][:, 1:] != -100).sum()) == 9 + 5 + 2  # columns 5-13, 5-9, 5-6
    assert torch.equal(got.label_mask, ref.label_mask)
    torch.testing.assert_close(got.loss, ref.loss, atol=1e-6, rtol=0)
    torch.testing.assert_close(got.log_probs, ref.log_probs, atol=1e-5, rtol=0)
    torch.testing.assert_close(got.entropy, ref.entropy, atol=1e-5, rtol=0)
    assert torch.equal(got.is_top1.bool(), ref.is_top1.bool())
    for (name, p_ref), p_got in zip(trl_model.named_parameters(), ours.parameters()):
        torch.testing.assert_close(p_got.grad, p_ref.grad, atol=1e-6, rtol=1e-4, msg=name)


def test_plain_forward_and_uncovered_configs_go_to_trl() -> None:
    trl_model, ours = model_pair()
    batch = sft_batch()
    with torch.no_grad():
        plain = ours(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        ref = trl_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
        torch.testing.assert_close(plain.logits, ref.logits)  # fused_lm_head=False: the model's own forward
        ours.config.final_logit_softcapping = 30.0  # soft-capped logits: TRL's path, not ours
        capped = ours(**batch, fused_lm_head=True)
        trl_model.config.final_logit_softcapping = 30.0
        torch.testing.assert_close(capped.log_probs, trl_model(**batch, fused_lm_head=True).log_probs, atol=1e-6, rtol=0)


def test_model_trl_did_not_patch_is_left_alone() -> None:
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2))
    before = model.forward
    use_label_positions_head(model)
    assert model.forward == before
