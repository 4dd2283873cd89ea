"""Training backends beyond ddp/fsdp2: DeepSpeed ZeRO-2/3 and LoRA adapters, on CPU.

DeepSpeed runs are real two-worker Ray groups (gloo). LoRA invariants that need to look inside the
policy (which weights changed, how many copies of the weights exist) use one in-process actor worker
(world size 1, no process group): the same class the Ray workers hold.
"""

from __future__ import annotations

import gc
import types

import pytest
import torch
from torch import nn

from alignctl.batch import Batch
from alignctl.config.core import to_dict
from alignctl.models.forward import compute_log_probs
from alignctl.trainers.rl_trainer import RLTrainer
from alignctl.workers.group import ResourcePool, RoleSpec, WorkerGroup
from alignctl.workers.ray_session import init_ray
from alignctl.workers.worker_process import DistContext
from rl_helpers import all_finite, make_assets, prompt_batch, read_metrics, rl_config, with_advantages

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("backends"))


@pytest.fixture(scope="module")
def ray_session():
    import ray

    init_ray(None, num_cpus=4)
    yield
    ray.shutdown()


# ---------------------------------------------------------------------------------------------- DeepSpeed


@pytest.mark.parametrize("stage", [2, 3])
def test_deepspeed_ppo_with_critic_runs_and_exports(assets, tmp_path, ray_session, stage):
    from transformers import AutoModelForCausalLM

    # Threshold 0: every ZeRO-3 parameter is sharded (DeepSpeed's default keeps tiny ones whole).
    zero = [f"{role}.deepspeed.{key}" for role in ("actor_rollout_ref.actor", "critic")
            for key in (f"zero_stage={stage}", "param_persistence_threshold=0")]
    cfg = rl_config(assets, tmp_path / "run", "algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=2",
                    "actor_rollout_ref.actor.strategy=deepspeed", "critic.strategy=deepspeed",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2", "algorithm.use_kl_in_reward=true",
                    *zero)
    result = RLTrainer(cfg).fit()
    # DeepSpeed's communication backend is a process-wide global it never tears down: its workers
    # are stopped at the end, not parked for the next run (trainer.reuse_workers).
    from alignctl.workers.parked_groups import parked_pids

    assert parked_pids() == []
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2]
    for row in rows:
        assert all_finite(row), row
        assert row["actor/grad_norm"] > 0 and row["critic/vf_loss"] > 0
    exported = AutoModelForCausalLM.from_pretrained(result.policy_dir)
    initial = AutoModelForCausalLM.from_pretrained(assets["model"])
    # Two Adam steps at lr 1e-3 move each touched weight by about 1e-3 per step.
    delta = (exported.model.embed_tokens.weight - initial.model.embed_tokens.weight).detach().abs().max()
    assert 1e-4 < float(delta) < 0.1


def _actor_group(assets, tmp_path, name: str, *overrides: str) -> WorkerGroup:
    cfg = rl_config(assets, tmp_path / name, "trainer.n_gpus_per_node=2",
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.grad_clip=0.1",
                    # Warm-up: the two optimizer steps run at lr/2 and lr, so the schedule is compared too.
                    "actor_rollout_ref.actor.optim.lr_warmup_steps=2", *overrides)
    role = RoleSpec("actor", "alignctl.workers.actor:ActorRolloutRefWorker", {"config": to_dict(cfg), "total_steps": 1})
    return WorkerGroup(ResourcePool(2, name=name), [role])


def _update_and_relog(group: WorkerGroup, train: Batch) -> tuple[dict[str, float], torch.Tensor]:
    metrics = group.split_collect("actor", "update_actor", train)[0]
    return metrics, group.split("actor", "compute_log_prob", train)["old_log_probs"]


ZERO_VARIANTS = {
    "zero2": ["zero_stage=2"],
    "zero3": ["zero_stage=3", "param_persistence_threshold=0"],
    # On CPU workers "offload" moves nothing, but DeepSpeed still runs its offload code path (fp32
    # partitions stepped apart from the parameters, deferred gradient copies): it must agree too.
    "zero3_offload": ["zero_stage=3", "param_persistence_threshold=0", "offload_param=true", "offload_optimizer=true"],
}


def test_one_deepspeed_update_equals_one_ddp_update(assets, tmp_path, ray_session):
    """8 responses, 2 workers, 2 mini-batches (2 optimizer steps) of 2 micro-batches per worker.
    ddp is the reference implementation: DeepSpeed must give the same loss and pre-clip gradient
    norm, and the same weights afterwards (log-probs after the update). Before that, an update with a
    NaN loss must stop with a clear error and leave no trace (weights, moments, schedule)."""
    ddp = _actor_group(assets, tmp_path, "ddp")
    try:
        batch = ddp.split("actor", "generate_sequences", prompt_batch(assets))
        batch = with_advantages(batch)
        old = ddp.split("actor", "compute_log_prob", batch)["old_log_probs"]
        # Old log-probs shifted against the advantages so that PPO clipping is active.
        train = batch.union(Batch({"old_log_probs": old - 0.5 * batch["advantages"]}))
        reference, after_ref = _update_and_relog(ddp, train)
    finally:
        ddp.shutdown()
    assert reference["actor/pg_clipfrac"] > 0
    assert reference["actor/grad_norm"] > 0.1  # grad_clip=0.1 scales the step: clipping is compared too
    assert (after_ref - old).abs().max() > 1e-3  # the update moved the policy
    poisoned = train.select([k for k in train.keys() if k != "advantages"]).union(
        Batch({"advantages": train["advantages"] * float("nan")}))
    for name, keys in ZERO_VARIANTS.items():
        group = _actor_group(assets, tmp_path, name, "actor_rollout_ref.actor.strategy=deepspeed",
                             *[f"actor_rollout_ref.actor.deepspeed.{key}" for key in keys])
        try:
            torch.testing.assert_close(group.split("actor", "compute_log_prob", batch)["old_log_probs"], old,
                                       rtol=0, atol=1e-6)
            with pytest.raises(Exception, match="actor gradient norm is (nan|inf)"):  # surfaced by Ray
                group.split_collect("actor", "update_actor", poisoned)
            metrics, after = _update_and_relog(group, train)
        finally:
            group.shutdown()
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/pg_clipfrac", "actor/entropy", "actor/lr"):
            assert metrics[key] == pytest.approx(reference[key], rel=1e-5, abs=1e-6), (name, key)
        torch.testing.assert_close(after, after_ref, rtol=0, atol=1e-5)


# ---------------------------------------------------------------------------------------------- LoRA

LORA = ["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
        "actor_rollout_ref.model.target_modules=[q_proj,v_proj,gate_proj]"]


def _local_actor(assets, tmp_path, *overrides: str):
    from alignctl.workers.actor import ActorRolloutRefWorker

    cfg = rl_config(assets, tmp_path / "run", *overrides)
    return ActorRolloutRefWorker(DistContext(0, 1, "cpu", "gloo"), to_dict(cfg), total_steps=2)


def _reachable_parameter_bytes(root: object) -> int:
    """Bytes of distinct parameter storages reachable from ``root`` by following object references
    (classes, modules and functions are skipped: they lead to global state, not to this worker)."""
    seen: set[int] = set()
    storages: dict[int, int] = {}
    stack = [root]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (type, types.ModuleType, types.FunctionType)):
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            if isinstance(obj, nn.Parameter):
                storage = obj.untyped_storage()
                storages[storage.data_ptr()] = storage.nbytes()
            continue
        stack.extend(gc.get_referents(obj))
    return sum(storages.values())


def _numel(model: nn.Module, lora: bool | None = None) -> int:
    return sum(p.numel() for n, p in model.named_parameters() if lora is None or ("lora_" in n) == lora)


@pytest.fixture(scope="module")
def lora_run(assets, tmp_path_factory):
    """An in-process LoRA actor (gradient checkpointing on) before and after two GRPO updates."""
    tmp = tmp_path_factory.mktemp("lora")
    worker = _local_actor(assets, tmp, *LORA, "actor_rollout_ref.model.enable_gradient_checkpointing=true",
                          "actor_rollout_ref.actor.use_kl_loss=true")
    model = worker.policy.model
    base_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}
    lora_before = {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}
    metrics = []
    for step in range(2):
        batch = worker.generate_sequences(prompt_batch(assets))
        batch = batch.union(worker.compute_ref_log_prob(batch))
        metrics.append(worker.update_actor(with_advantages(batch, seed=step)))
    worker.save(str(tmp / "export"))
    return {"worker": worker, "base_before": base_before, "lora_before": lora_before, "metrics": metrics,
            "export": tmp / "export", "tmp": tmp}


def test_lora_reference_is_the_same_module_without_a_weight_copy(assets, tmp_path, lora_run):
    from transformers import AutoModelForCausalLM

    worker = lora_run["worker"]
    base = AutoModelForCausalLM.from_pretrained(assets["model"])
    assert worker.policy.ref_engine is None
    # Every parameter reachable from the worker: the base weights once plus the adapters.
    expected = (_numel(base) + _numel(worker.policy.model, lora=True)) * 4  # float32
    assert _reachable_parameter_bytes(worker) == expected
    # Control: the same count sees the frozen reference copy of a full fine-tuning worker with a KL term.
    full = _local_actor(assets, tmp_path, "actor_rollout_ref.actor.use_kl_loss=true")
    assert _reachable_parameter_bytes(full) == 2 * _numel(base) * 4


def test_no_reference_copy_without_a_kl_term(assets, tmp_path):
    """Neither use_kl_loss nor use_kl_in_reward (verl's defaults): no loss reads the reference, so the
    worker holds the policy's weights once and a reference pass is a clear error, not a silent one."""
    from transformers import AutoModelForCausalLM

    worker = _local_actor(assets, tmp_path)
    assert worker.policy.ref_engine is None
    assert _reachable_parameter_bytes(worker) == _numel(AutoModelForCausalLM.from_pretrained(assets["model"])) * 4
    with pytest.raises(RuntimeError, match="no reference policy"):
        worker.compute_ref_log_prob(worker.generate_sequences(prompt_batch(assets)))


def test_lora_trains_only_adapters(lora_run):
    model = lora_run["worker"].policy.model
    for metrics in lora_run["metrics"]:
        assert all_finite(metrics) and metrics["actor/grad_norm"] > 0
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable == set(lora_run["lora_before"]) and trainable
    for name, param in model.named_parameters():
        if name in lora_run["base_before"]:
            assert torch.equal(param, lora_run["base_before"][name]), (name, param.requires_grad)  # bit-identical
    changed = [n for n, p in model.named_parameters() if n in lora_run["lora_before"]
               and not torch.equal(p, lora_run["lora_before"][n])]
    assert len(changed) == len(lora_run["lora_before"])  # lora_B starts at 0 and A gets gradients once B moved


def test_lora_reference_log_probs_are_the_base_model_and_rollout_uses_adapters(assets, lora_run):
    from transformers import AutoModelForCausalLM

    worker = lora_run["worker"]
    batch = worker.generate_sequences(prompt_batch(assets, do_sample=False))
    ref = worker.compute_ref_log_prob(batch)["ref_log_prob"]
    policy = worker.compute_log_prob(batch)["old_log_probs"]
    base = AutoModelForCausalLM.from_pretrained(assets["model"]).eval()
    with torch.no_grad():
        expected = compute_log_probs(base, batch["input_ids"], batch["attention_mask"], batch["responses"].shape[1],
                                     position_ids=batch["position_ids"]).log_probs
    torch.testing.assert_close(ref, expected, rtol=0, atol=1e-6)
    mask = batch["response_mask"].bool()
    # Generation ran the adapted policy: its sampled log-probs are the policy's, not the base's.
    torch.testing.assert_close(batch["rollout_log_probs"][mask], policy[mask], rtol=0, atol=1e-5)
    assert (policy - ref)[mask].abs().max() > 1e-3


def test_lora_export_is_merged_and_matches_the_adapted_model(assets, lora_run):
    from transformers import AutoModelForCausalLM

    exported = AutoModelForCausalLM.from_pretrained(lora_run["export"]).eval()
    assert not any("lora" in n for n, _ in exported.named_parameters())
    ids = torch.randint(3, exported.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    adapted = lora_run["worker"].policy.model.eval()
    with torch.no_grad():
        torch.testing.assert_close(exported(input_ids=ids).logits, adapted(input_ids=ids).logits, rtol=0, atol=1e-5)
    initial = AutoModelForCausalLM.from_pretrained(assets["model"])
    assert torch.equal(exported.model.embed_tokens.weight, initial.model.embed_tokens.weight)  # not adapted
    q = exported.model.layers[0].self_attn.q_proj.weight
    assert (q - initial.model.layers[0].self_attn.q_proj.weight).abs().max() > 1e-5  # adapter merged in


def test_lora_gradient_checkpointing_gives_the_same_gradients(assets, tmp_path):
    """Checkpointing recomputes activations; LoRA's frozen embeddings must not cut the gradient."""
    grads = []
    for checkpointing in ("false", "true"):
        worker = _local_actor(assets, tmp_path / checkpointing, *LORA,
                              f"actor_rollout_ref.model.enable_gradient_checkpointing={checkpointing}")
        model = worker.policy.model
        with torch.no_grad():  # non-zero B so that gradients reach A as well
            for name, p in model.named_parameters():
                if "lora_B" in name:
                    p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.1)
        model.train()
        ids = torch.randint(3, model.config.vocab_size, (2, 10), generator=torch.Generator().manual_seed(1))
        model(input_ids=ids, labels=ids).loss.backward()
        grads.append({n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        assert grads[0][name].abs().max() > 0, name
        torch.testing.assert_close(grads[1][name], grads[0][name], rtol=0, atol=1e-6)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp2", "deepspeed"])
def test_lora_grpo_two_workers_runs_and_exports(assets, tmp_path, ray_session, strategy):
    from transformers import AutoModelForCausalLM

    cfg = rl_config(assets, tmp_path / "run", *LORA, "trainer.n_gpus_per_node=2", "algorithm.adv_estimator=grpo",
                    f"actor_rollout_ref.actor.strategy={strategy}", "actor_rollout_ref.actor.use_kl_loss=true",
                    "actor_rollout_ref.actor.deepspeed.zero_stage=3",  # read only by the deepspeed run
                    "actor_rollout_ref.actor.deepspeed.param_persistence_threshold=0",
                    "actor_rollout_ref.model.enable_gradient_checkpointing=true")
    result = RLTrainer(cfg).fit()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and all(all_finite(r) for r in rows)
    exported = AutoModelForCausalLM.from_pretrained(result.policy_dir)
    initial = AutoModelForCausalLM.from_pretrained(assets["model"])
    assert torch.equal(exported.model.embed_tokens.weight, initial.model.embed_tokens.weight)
    v_new, v_old = exported.model.layers[0].self_attn.v_proj.weight, initial.model.layers[0].self_attn.v_proj.weight
    assert 1e-6 < float((v_new - v_old).detach().abs().max()) < 0.1  # the adapters are merged in


def test_deepspeed_offload_param_needs_zero3(assets, tmp_path):
    from alignctl.errors import UserError

    with pytest.raises(UserError, match="actor_rollout_ref.actor.deepspeed.offload_param"):
        _local_actor(assets, tmp_path, "actor_rollout_ref.actor.strategy=deepspeed",
                     "actor_rollout_ref.actor.deepspeed.offload_param=true")
