"""bf16 copies of the policy for the rollout (``rollout.dtype``) and the reference (``ref.dtype``).

Unit checks run on a tiny Llama built here (tied and untied output projections); the worker checks
use one in-process actor worker (world size 1, no process group), the class the Ray workers hold.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from alignctl.config.core import to_dict
from alignctl.errors import UserError
from alignctl.models.forward import compute_log_probs
from alignctl.workers.worker_process import DistContext
from alignctl.rollout.hf_engine import HFRolloutEngine
from alignctl.workers.low_precision import low_precision_copy
from rl_helpers import make_assets, prompt_batch, rl_config, with_advantages


def _llama(tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=tied)
    return LlamaForCausalLM(config).train()


@pytest.mark.parametrize("tied", [True, False])
def test_copy_is_bf16_with_a_float32_untied_head(tied):
    model = _llama(tied)
    clone = low_precision_copy(model, "bfloat16", "cpu")
    head, embed = clone.get_output_embeddings().weight, clone.get_input_embeddings().weight
    assert head.dtype == torch.float32 and embed.dtype == torch.bfloat16
    assert head.data_ptr() != embed.data_ptr()
    assert torch.equal(head, model.get_output_embeddings().weight.detach())  # the float32 head, exactly
    others = [p for n, p in clone.named_parameters() if not n.startswith("lm_head")]
    assert others and all(p.dtype == torch.bfloat16 and not p.requires_grad for p in others)
    # Buffers keep their dtype: rotary frequencies rounded to bf16 would shift every position.
    assert {b.dtype for b in clone.buffers()} == {b.dtype for b in model.buffers()}
    assert not clone.training and model.training  # the source is untouched
    assert model.get_input_embeddings().weight.dtype == torch.float32
    # Same logits up to bf16 rounding of the body, against the float32 module's own forward. Measured on
    # this model: max |diff| 0.0031 (tied) / 0.0037 (untied) for logits of std 0.18 / 0.16.
    ids = torch.randint(0, 97, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = model.eval()(input_ids=ids).logits
        low = clone(input_ids=ids).logits
    assert low.dtype == torch.float32
    assert float((low - ref).abs().max()) < 0.02
    assert float((low - ref).abs().max()) > 0  # it did compute in bf16


@pytest.mark.parametrize("tied", [True, False])
def test_engine_sync_refreshes_every_weight_rounded(tied):
    """The actor keeps the copy current through the engine's sync_weights((name, tensor) pairs), with
    tied weights listed under both names so the untied float32 head is refreshed too."""
    model = _llama(tied)
    clone = low_precision_copy(model, "bfloat16", "cpu")
    with torch.no_grad():  # an update: every weight moves
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.01)
    HFRolloutEngine(clone).sync_weights(model.named_parameters(remove_duplicate=False))
    source = dict(model.named_parameters(remove_duplicate=False))
    for name, p in clone.named_parameters(remove_duplicate=False):
        assert torch.equal(p, source[name].detach().to(p.dtype)), name
    assert torch.equal(clone.get_output_embeddings().weight, model.get_output_embeddings().weight.detach())


# ---------------------------------------------------------------------------------------------- worker


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("low_precision"))


BF16 = ["actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.ref.dtype=bfloat16"]


def _actor(assets, tmp_path, *overrides: str):
    from alignctl.workers.actor import ActorRolloutRefWorker

    cfg = rl_config(assets, tmp_path / "run", "actor_rollout_ref.actor.recompute_old_log_prob=false",
                    "actor_rollout_ref.actor.use_kl_loss=true", *overrides)  # a KL term: the reference is built
    return ActorRolloutRefWorker(DistContext(0, 1, "cpu", "gloo"), to_dict(cfg), total_steps=2)


def _float32_log_probs(model, batch):
    with torch.no_grad():
        return compute_log_probs(model, batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1],
                                 position_ids=batch["position_ids"]).log_probs


def test_worker_generates_with_the_copy_and_refreshes_it_after_an_update(assets, tmp_path):
    actor = _actor(assets, tmp_path, *BF16)
    policy = actor.policy
    assert actor.rollout.model is policy.rollout_model and policy.rollout_model is not policy.model
    batch = actor.generate_sequences(prompt_batch(assets))
    mask = batch["response_mask"].bool()
    # The engine's log-probs come from the bf16 copy: close to the float32 policy's, not equal (measured on
    # this tiny model: max gap 0.0025, mean 0.0007; SmolLM2 in the quickstart: see docs/models.md).
    exact = _float32_log_probs(policy.model, batch)
    gap = (batch["rollout_log_probs"] - exact).abs()[mask]
    assert 0 < float(gap.max()) < 0.02
    # The reference is a bf16 copy too, of the initial weights (= the policy before any update).
    ref = actor.compute_ref_log_prob(batch)["ref_log_prob"]
    assert policy.ref_engine.model.get_input_embeddings().weight.dtype == torch.bfloat16
    assert 0 < float((ref - exact).abs()[mask].max()) < 0.02

    train = with_advantages(batch.union(actor.compute_ref_log_prob(batch)))
    actor.update_actor(train.union(actor.compute_log_prob(train)))
    trained = policy.model.get_input_embeddings().weight.detach()
    copy_embed = policy.rollout_model.get_input_embeddings().weight
    assert not torch.equal(copy_embed, trained.to(torch.bfloat16))  # stale until the next rollout
    actor.generate_sequences(prompt_batch(assets, first=4))
    assert torch.equal(copy_embed, trained.to(torch.bfloat16))
    assert torch.equal(policy.rollout_model.get_output_embeddings().weight,
                       policy.model.get_output_embeddings().weight.detach())


def test_auto_generates_with_the_training_module(assets, tmp_path):
    actor = _actor(assets, tmp_path)
    assert actor.policy.rollout_model is None and actor.rollout.model is actor.policy.model
    assert actor.policy.ref_engine.model.get_input_embeddings().weight.dtype == torch.float32


@pytest.mark.parametrize(("overrides", "needs"), [
    (["actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.model.lora_rank=4"], "full fine-tuning"),
    (["actor_rollout_ref.ref.dtype=bfloat16", "actor_rollout_ref.model.lora_rank=4"], "full fine-tuning"),
    (["actor_rollout_ref.ref.dtype=bfloat16", "actor_rollout_ref.actor.strategy=fsdp2"], "actor.strategy=ddp"),
])
def test_refused_before_anything_starts(assets, tmp_path, overrides, needs):
    with pytest.raises(UserError, match=needs) as err:
        rl_config(assets, tmp_path / "run", *overrides).validate()
    key = overrides[0].split("=")[0]
    assert f"key '{key}'" in str(err.value)
