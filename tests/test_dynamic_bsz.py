"""A real actor training step with token-budgeted (dynamic) micro-batches gives the same gradients
as fixed micro-batches of the same data: the loss of every micro-batch is normalised by the
mini-batch's global counts, so how the rows are split must not matter (fp32, one in-process actor
worker, the class the Ray workers hold)."""

from __future__ import annotations

import pytest
import torch

from alignctl.batch import Batch
from alignctl.config.core import to_dict
from alignctl.workers.worker_process import DistContext
from alignctl.workers.microbatching import micro_batches
from rl_helpers import make_assets, rl_config

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("dynbsz"))


def _actor(assets, tmp_path, *overrides: str):
    from alignctl.workers.actor import ActorRolloutRefWorker

    cfg = rl_config(assets, tmp_path / "run", "actor_rollout_ref.actor.grad_clip=0",
                    "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.entropy_coeff=0.01",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=4", *overrides)
    return ActorRolloutRefWorker(DistContext(0, 1, "cpu", "gloo"), to_dict(cfg), total_steps=2)


def _batch(worker, assets) -> Batch:
    from alignctl.data.rl_dataset import RLPromptDataset, to_batch
    from alignctl.models.loading import load_tokenizer

    tokenizer = load_tokenizer(assets["model"], padding_side="left")
    data = RLPromptDataset([str(assets["data"] / "train.parquet")], tokenizer, max_prompt_length=128)
    prompts = to_batch([data[i] for i in range(4)], list(range(4)))
    prompts.meta.update(n=2, do_sample=True, temperature=1.0, top_p=1.0, top_k=-1, seed=5,
                        prompt_width=max(len(p) for p in prompts["prompt_ids"]))
    batch = worker.generate_sequences(prompts)
    batch = batch.union(worker.compute_ref_log_prob(batch))
    old = worker.compute_log_prob(batch)["old_log_probs"]
    advantages = torch.randn(batch["response_mask"].shape, generator=torch.Generator().manual_seed(0))
    advantages = advantages * batch["response_mask"]
    # Old log-probs shifted against the advantages, so the PPO clip is active in some tokens.
    return batch.union(Batch({"advantages": advantages, "old_log_probs": old - 0.3 * advantages}))


def _step_gradients(worker, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """The gradients the optimizer sees at its step (observed with torch's step pre-hook)."""
    seen: dict[str, torch.Tensor] = {}
    names = {id(p): n for n, p in worker.engine.module.named_parameters()}

    def record(optimizer, args, kwargs):
        for group in optimizer.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    seen[names[id(p)]] = p.grad.detach().clone()

    handle = worker.engine.optimizer.register_step_pre_hook(record)
    try:
        metrics = worker.update_actor(batch)
    finally:
        handle.remove()
    return seen, metrics


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
def test_dynamic_micro_batches_give_the_gradients_of_fixed_ones(assets, tmp_path, agg):
    fixed = _actor(assets, tmp_path / "fixed", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                   f"actor_rollout_ref.actor.loss_agg_mode={agg}")
    batch = _batch(fixed, assets)
    lengths = batch["attention_mask"].sum(-1)
    budget = int(lengths.max()) + int(lengths.min())  # forces uneven parts of 1-3 rows
    dynamic = _actor(assets, tmp_path / "dynamic", "actor_rollout_ref.actor.use_dynamic_bsz=true",
                     f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={budget}",
                     f"actor_rollout_ref.actor.loss_agg_mode={agg}")
    fixed_parts = [len(p) for p in micro_batches(batch, fixed.plan)]
    dynamic_parts = [len(p) for p in micro_batches(batch, dynamic.plan)]
    assert fixed_parts == [2, 2, 2, 2] and sorted(dynamic_parts) != sorted(fixed_parts)

    grads_fixed, metrics_fixed = _step_gradients(fixed, batch)
    grads_dynamic, metrics_dynamic = _step_gradients(dynamic, batch)
    assert grads_fixed.keys() == grads_dynamic.keys() and len(grads_fixed) > 5
    assert metrics_fixed["actor/pg_clipfrac"] > 0
    for name, grad in grads_fixed.items():
        torch.testing.assert_close(grads_dynamic[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    for key in ("actor/pg_loss", "actor/kl_loss", "actor/entropy", "actor/grad_norm", "actor/pg_clipfrac"):
        assert metrics_dynamic[key] == pytest.approx(metrics_fixed[key], rel=1e-5, abs=1e-7), key
    # A wrong normaliser (each part's own mean) would give visibly different gradients: the check can fail.
    assert max(float(g.abs().max()) for g in grads_fixed.values()) > 1e-4
