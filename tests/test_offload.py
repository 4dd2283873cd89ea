"""Memory options (issue 22, item 4): frozen models parked in CPU memory between their passes
(``ref.fsdp_config.param_offload``, ``reward_model.model.fsdp_config.param_offload``), FSDP2's
``CPUOffloadPolicy`` (``actor.fsdp_config.offload_policy``), and the hf engine keeping no KV cache
between rollouts (``rollout.free_cache_engine``).

On this CPU machine an offload moves nothing (CPU memory is the worker's memory), so the tests check
what can fail here: where tensors are after each phase on a second device type (``meta``), that the
offload code paths really run (torch's own offload flags) and give the same numbers as without
offload, and that no cache object survives a rollout. What only a GPU can show (memory freed on the
device, pinned host copies) is in the CUDA tests at the end, skipped without CUDA.
"""

from __future__ import annotations

import gc
import importlib.util
import warnings
from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from alignctl.config.core import to_dict
from alignctl.workers.offload import ParkedModule
from rl_helpers import make_assets, prompt_batch, rl_config, with_advantages
from spawn_helpers import run_ranks

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU: device memory and pinned "
                                                                      "host memory exist only there")


def _llama(hidden: int = 16, vocab: int = 32, tied: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=hidden, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      intermediate_size=2 * hidden, vocab_size=vocab, tie_word_embeddings=tied, pad_token_id=0,
                      eos_token_id=2)
    return LlamaForCausalLM(cfg).eval()


def _devices(model: nn.Module) -> set[str]:
    return {t.device.type for t in [*model.parameters(), *model.buffers()]}


# ---------------------------------------------------------------------------------------------- parking


def test_parked_module_is_on_its_device_only_inside_its_pass() -> None:
    """``meta`` stands in for the GPU: a second device type that a forgotten park or load would
    show. Every parameter and buffer (the rotary table too) is in CPU memory between passes, on the
    device inside, the tied embedding stays one parameter, and the values survive two round trips."""
    model = _llama()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    parking = ParkedModule(model, "meta")
    assert _devices(model) == {"cpu"}
    for _ in range(2):
        with parking.on_device() as inside:
            assert inside is model and _devices(model) == {"meta"}
            assert model.lm_head.weight is model.model.embed_tokens.weight
        assert _devices(model) == {"cpu"}
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert not any(p.requires_grad for p in model.parameters())  # frozen: nothing is ever copied back


def test_parked_module_on_a_cpu_worker_copies_nothing() -> None:
    """On a CPU worker the 'device copy' is the CPU copy itself: same storage, same outputs."""
    model = _llama()
    storages = [p.data_ptr() for p in model.parameters()]
    ids = torch.tensor([[3, 4, 5, 6]])
    with torch.no_grad():
        expected = model(ids).logits
    parking = ParkedModule(model, "cpu")
    with parking.on_device(), torch.no_grad():
        assert [p.data_ptr() for p in model.parameters()] == storages
        assert torch.equal(model(ids).logits, expected)


# ---------------------------------------------------------------------------------------------- roles


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_assets(tmp_path_factory.mktemp("offload"))


def _local_actor(assets: dict[str, Path], run_dir: Path, *overrides: str):  # noqa: ANN202 - an actor worker
    from alignctl.workers.actor import ActorRolloutRefWorker
    from alignctl.workers.worker_process import DistContext

    cfg = rl_config(assets, run_dir, "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.5",
                    *overrides)
    return ActorRolloutRefWorker(DistContext(0, 1, "cpu", "gloo"), to_dict(cfg), total_steps=2)


def _two_steps(worker, assets: dict[str, Path]) -> list[dict[str, object]]:  # noqa: ANN001 - an actor worker
    """Two RL steps (rollout, reference log-probs, a KL-loss update); what each step saw."""
    out = []
    for step in range(2):
        batch = worker.generate_sequences(prompt_batch(assets))
        ref = worker.compute_ref_log_prob(batch)
        actor = worker.compute_log_prob(batch)["old_log_probs"]
        metrics = worker.update_actor(with_advantages(batch.union(ref), seed=step))
        out.append({"responses": batch["responses"], "ref": ref["ref_log_prob"], "actor": actor, "metrics": metrics})
    return out


def test_parked_reference_gives_the_same_two_steps(assets: dict[str, Path], tmp_path: Path) -> None:
    """ddp, one in-process worker: with the reference parked between its passes, two RL steps give
    bit-identical responses, reference log-probs and update metrics. After the first update the
    policy differs from the reference, so a parked copy that lost or swapped weights would show."""
    plain = _local_actor(assets, tmp_path / "plain")
    parked = _local_actor(assets, tmp_path / "parked", "actor_rollout_ref.ref.fsdp_config.param_offload=true")
    assert plain.policy.ref_parking is None and parked.policy.ref_parking is not None
    expected, got = _two_steps(plain, assets), _two_steps(parked, assets)
    for a, b in zip(expected, got, strict=True):
        assert torch.equal(a["responses"], b["responses"]) and torch.equal(a["ref"], b["ref"])
        assert a["metrics"] == b["metrics"]
    assert not torch.allclose(got[1]["ref"], got[1]["actor"], atol=1e-4)  # the reference really is another model
    # Measured: KL loss 0.0 in step 1 (policy = reference), 0.0175 in step 2.
    assert got[0]["metrics"]["actor/kl_loss"] < 1e-6 and got[1]["metrics"]["actor/kl_loss"] > 1e-3


def test_parked_reward_model_scores_the_same(assets: dict[str, Path], tmp_path: Path) -> None:
    """The reward-model role with its weights parked between scoring passes gives the same scores,
    twice over (the second pass loads the weights again after the first parked them)."""
    from alignctl.batch import Batch
    from alignctl.models.loading import load_reward_model, load_tokenizer
    from alignctl.workers.worker_process import DistContext
    from alignctl.workers.rm_worker import RewardModelWorker

    torch.manual_seed(0)  # the fresh score head of a causal-LM folder, saved once for both workers
    load_reward_model(assets["model"]).save_pretrained(tmp_path / "rm")
    load_tokenizer(assets["model"], padding_side="right").save_pretrained(tmp_path / "rm")
    texts = ["12", "7 + 5 = 12", "no idea", "####"]
    batch = Batch(lists={"response_text": texts, "raw_prompt": [[{"role": "user", "content": "5 + 7?"}]] * 4})
    workers = []
    for offload in ("false", "true"):
        cfg = rl_config(assets, tmp_path / "run", "reward_model.enable=true", f"reward_model.model.path={tmp_path / 'rm'}",
                        f"reward_model.model.fsdp_config.param_offload={offload}")
        workers.append(RewardModelWorker(DistContext(0, 1, "cpu", "gloo"), to_dict(cfg)))
    plain, parked = workers
    assert plain.parking is None and parked.parking is not None
    expected = plain.compute_rm_score(batch)["rm_scores"]
    assert expected.unique().numel() == 4  # four different texts, four different scores
    for _ in range(2):
        assert torch.equal(parked.compute_rm_score(batch)["rm_scores"], expected)


# ---------------------------------------------------------------------------------------------- fsdp2


def _param_groups(unit: object) -> list:
    """An FSDP2 unit's parameter groups: a list in torch 2.13, one group (or None) in torch 2.11."""
    state = unit._get_fsdp_state()  # type: ignore[attr-defined]
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [] if group is None else [group]
    return list(groups)


def _fsdp2_offload_check(rank: int, assets: dict[str, Path], run_dir: str) -> str:
    """One rank: the same rollout, reference pass and two-mini-batch update with plain fsdp2 and with
    the actor and the reference under CPUOffloadPolicy; returns what the parent compares."""
    from torch.distributed.fsdp import FSDPModule

    from alignctl.batch import Batch
    from alignctl.workers.actor import ActorRolloutRefWorker
    from alignctl.workers.critic import CriticWorker
    from alignctl.workers.worker_process import DistContext

    results = {}
    for name, keys in (("plain", []), ("offload", ["actor_rollout_ref.actor.fsdp_config.offload_policy=true",
                                                   "actor_rollout_ref.ref.fsdp_config.param_offload=true",
                                                   "critic.model.fsdp_config.offload_policy=true"])):
        cfg = to_dict(rl_config(
            assets, Path(run_dir) / name, "trainer.n_gpus_per_node=2", "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1", "critic.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.actor.grad_clip=0.1", "critic.grad_clip=0.1", "actor_rollout_ref.actor.use_kl_loss=true", *keys))
        ctx = DistContext(rank, 2, "cpu", "gloo")
        worker, critic = ActorRolloutRefWorker(ctx, cfg, total_steps=1), CriticWorker(ctx, cfg, total_steps=1)
        # torch's own per-parameter flag (private, no public accessor): the policy reached every unit.
        units = [m for engine in (worker.engine, worker.policy.ref_engine, critic.engine) for m in engine.model.modules()
                 if isinstance(m, FSDPModule)]
        flags = {p.offload_to_cpu for m in units for g in _param_groups(m) for p in g.fsdp_params}
        batch = worker.generate_sequences(prompt_batch(assets, 2, first=2 * rank))
        batch = with_advantages(batch.union(worker.compute_ref_log_prob(batch)), seed=rank)
        values = critic.compute_values(batch)["values"]
        returns = Batch({"values": values, "returns": values + batch["advantages"]})
        metrics = {**worker.update_actor(batch), **critic.update_critic(batch.union(returns))}
        after = worker.compute_log_prob(batch)["old_log_probs"]
        results[name] = {"flags": sorted(flags), "responses": batch["responses"], "ref": batch["ref_log_prob"],
                         "metrics": metrics, "after": after, "values": values,
                         "values_after": critic.compute_values(batch)["values"]}
    torch.save(results, Path(run_dir) / f"results{rank}.pt")
    return "done"


def test_fsdp2_offload_update_equals_the_plain_fsdp2_update(assets: dict[str, Path], tmp_path: Path) -> None:
    """Two gloo workers, the tiny model, fp32. With CPUOffloadPolicy on the actor (parameters,
    gradients and AdamW state), the reference and the critic, one update of two clipped optimizer
    steps gives the same responses, reference log-probs, losses, gradient norms and log-probs /
    values afterwards as plain fsdp2. Reference: the plain fsdp2 run. Tolerance: 1e-6 absolute in
    fp32 (the offload moves storage, not arithmetic; measured difference 0)."""
    assert run_ranks(_fsdp2_offload_check, 2, tmp_path, assets, str(tmp_path)) == ["done", "done"]
    for rank in range(2):
        got = torch.load(tmp_path / f"results{rank}.pt", weights_only=False)
        plain, off = got["plain"], got["offload"]
        assert plain["flags"] == [False] and off["flags"] == [True]
        assert torch.equal(plain["responses"], off["responses"])
        torch.testing.assert_close(off["ref"], plain["ref"], rtol=0, atol=1e-6)
        assert plain["metrics"]["actor/grad_norm"] > 0.1  # grad_clip=0.1: the offload's clipping path is compared
        assert plain["metrics"]["critic/grad_norm"] > 0.1
        for key in ("actor/pg_loss", "actor/kl_loss", "actor/grad_norm", "actor/entropy", "critic/vf_loss",
                    "critic/grad_norm"):
            assert off["metrics"][key] == pytest.approx(plain["metrics"][key], rel=0, abs=1e-6), key
        assert (plain["after"] - plain["ref"]).abs().max() > 1e-3  # the update moved the policy
        assert (plain["values_after"] - plain["values"]).abs().max() > 1e-3  # and the critic
        for key in ("after", "values", "values_after"):
            torch.testing.assert_close(off[key], plain[key], rtol=0, atol=1e-6)


def _zero3_reference_check(rank: int, assets: dict[str, Path], run_dir: str) -> str:
    """One rank: reference log-probs of a ZeRO-3 actor's reference, kept whole-sharded or offloaded."""
    import os

    from alignctl.workers.actor import ActorRolloutRefWorker
    from alignctl.workers.worker_process import DistContext

    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE="2", DS_ACCELERATOR_LOG_LEVEL="error")
    out, batch = {}, None
    for offload in ("false", "true"):
        cfg = rl_config(assets, Path(run_dir) / offload, "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=deepspeed",
                        "actor_rollout_ref.actor.deepspeed.zero_stage=3", "actor_rollout_ref.actor.deepspeed.param_persistence_threshold=0",
                        f"actor_rollout_ref.ref.fsdp_config.param_offload={offload}", "actor_rollout_ref.actor.use_kl_loss=true")
        worker = ActorRolloutRefWorker(DistContext(rank, 2, "cpu", "gloo"), to_dict(cfg), total_steps=1)
        offloaded = worker.policy.ref_engine.ds.zero_offload_param()  # DeepSpeed's own reading of its config
        # One rollout (ZeRO-3 generation gathers every layer's parameters for every token: the slow part),
        # scored by both reference engines, so the comparison is on the very same tokens.
        if batch is None:
            batch = worker.generate_sequences(prompt_batch(assets, 2, first=2 * rank))
        out[offload] = (getattr(offloaded, "device", None), worker.compute_ref_log_prob(batch)["ref_log_prob"])
    (plain_device, plain), (off_device, off) = out["false"], out["true"]
    return f"{plain_device} {str(off_device).split('.')[-1].lower()} {float((plain - off).abs().max())}"


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed (a declared dependency; the GPU machine's bundle has none)")
def test_zero3_reference_offload_gives_the_same_log_probs(assets: dict[str, Path], tmp_path: Path) -> None:
    """ZeRO-3 (two gloo workers): ``ref.fsdp_config.param_offload`` turns on DeepSpeed's offload_param
    for the reference engine (its parameter partitions in CPU memory; DeepSpeed runs its offload code
    path on CPU too) and the reference log-probs stay identical (measured difference 0)."""
    for result in run_ranks(_zero3_reference_check, 2, tmp_path, assets, str(tmp_path)):
        no_offload, offload_device, diff = result.split()
        assert (no_offload, offload_device) == ("None", "cpu") and float(diff) <= 1e-6, result


# ---------------------------------------------------------------------------------------------- hf engine


def _live(kind: type) -> list[object]:
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op object warns
        warnings.simplefilter("ignore", FutureWarning)
        return [o for o in gc.get_objects() if isinstance(o, kind)]


def test_hf_engine_keeps_no_cache_or_tensor_between_generate_calls() -> None:
    """After generate (and sleep, as the actor calls it with free_cache_engine) no KV cache object and
    no tensor of the rollout is alive except those of the returned output: counted among all objects
    Python's garbage collector tracks, without running a collection first (reference counting alone
    must free them). A second rollout with the same seed gives the same output."""
    from transformers.cache_utils import Cache, CacheLayerMixin

    from alignctl.rollout import SamplingParams
    from alignctl.rollout.hf_engine import HFRolloutEngine

    model = _llama(hidden=32, vocab=64)
    engine = HFRolloutEngine(model)
    prompts, params = [[5, 6, 7], [9, 10, 11, 12], [20]], SamplingParams(n=2, max_new_tokens=12, seed=4)
    first = engine.generate(prompts, params)  # warm-up: lazily created module state is not a leak
    engine.sleep()
    gc.collect()
    tensors_before = {id(t) for t in _live(torch.Tensor)}
    out = engine.generate(prompts, params)
    engine.sleep()
    assert _live(Cache) == [] and _live(CacheLayerMixin) == []
    new = [t for t in _live(torch.Tensor) if id(t) not in tensors_before]
    output = {id(t) for t in vars(out).values() if isinstance(t, torch.Tensor)}
    assert new and {id(t) for t in new} <= output, [tuple(t.shape) for t in new if id(t) not in output]
    assert torch.equal(out.response_ids, first.response_ids) and torch.equal(out.log_probs, first.log_probs)
    assert (out.response_lengths > 1).any()  # a real rollout, not an immediate stop


# ---------------------------------------------------------------------------------------------- config


@pytest.mark.parametrize(("overrides", "needles"), [
    (["actor_rollout_ref.actor.fsdp_config.offload_policy=true"],
     ["'actor_rollout_ref.actor.fsdp_config.offload_policy' needs actor_rollout_ref.actor.strategy=fsdp2", "got strategy=ddp"]),
    (["actor_rollout_ref.actor.strategy=deepspeed", "actor_rollout_ref.actor.fsdp_config.offload_policy=true"],
     ["got strategy=deepspeed", "actor_rollout_ref.actor.deepspeed.offload_optimizer"]),
    (["algorithm.adv_estimator=gae", "critic.model.fsdp_config.offload_policy=true"],
     ["'critic.model.fsdp_config.offload_policy' needs critic.strategy=fsdp2"]),
    (["actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.ref.fsdp_config.param_offload=true"],
     ["'actor_rollout_ref.ref.fsdp_config.param_offload' has nothing to offload", "lora_rank"]),
])
def test_offload_keys_refuse_what_cannot_work(overrides: list[str], needles: list[str]) -> None:
    from conftest import assert_user_error, run_cli

    result = run_cli("ppo", "actor_rollout_ref.model.path=m", "data.train_files=[t.parquet]", *overrides)
    assert_user_error(result, *needles)


def test_offload_keys_pass_validation_where_they_apply() -> None:
    from alignctl.config.core import load_config
    from alignctl.config.rl import RLConfig

    cfg = load_config(RLConfig, None, [
        "actor_rollout_ref.model.path=m", "data.train_files=[t.parquet]", "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
        "critic.strategy=fsdp2", "critic.model.fsdp_config.offload_policy=true",
        "actor_rollout_ref.ref.fsdp_config.param_offload=true", "reward_model.model.fsdp_config.param_offload=true",
        "actor_rollout_ref.rollout.free_cache_engine=false"])
    assert cfg.actor_rollout_ref.actor.fsdp_config.offload_policy and cfg.critic.model.fsdp_config.offload_policy
    assert cfg.actor_rollout_ref.ref.fsdp_config.param_offload and not cfg.actor_rollout_ref.rollout.free_cache_engine


# ---------------------------------------------------------------------------------------------- CUDA only


def _weight_bytes(model: nn.Module) -> int:
    return sum(t.numel() * t.element_size() for t in [*model.parameters(), *model.buffers()])


@needs_cuda
def test_parked_module_frees_cuda_memory_between_passes() -> None:
    """A parked model takes its weights' bytes on the GPU only inside its pass, its CPU copies are
    pinned, and its outputs equal the unparked model's."""
    model = _llama(hidden=256, vocab=1000).cuda()
    ids = torch.randint(0, 1000, (2, 16), device="cuda")
    with torch.no_grad():
        expected = model(ids).logits
    weights = _weight_bytes(model)
    torch.cuda.synchronize()
    with_weights = torch.cuda.memory_allocated()
    parking = ParkedModule(model, "cuda")
    torch.cuda.synchronize()
    assert with_weights - torch.cuda.memory_allocated() >= weights  # every device copy freed
    assert _devices(model) == {"cpu"} and all(p.is_pinned() for p in model.parameters())
    parked = torch.cuda.memory_allocated()
    with parking.on_device(), torch.no_grad():
        assert _devices(model) == {"cuda"}
        assert torch.cuda.memory_allocated() - parked >= weights
        torch.testing.assert_close(model(ids).logits, expected, rtol=0, atol=0)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() == parked


@pytest.fixture
def cuda_process_group(tmp_path: Path):  # noqa: ANN201 - a fixture
    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    torch.cuda.set_device(0)
    try:
        yield
    finally:
        dist.destroy_process_group()


@needs_cuda
def test_fsdp2_offload_keeps_shards_gradients_and_adam_state_in_pinned_cpu_memory(cuda_process_group) -> None:
    """One NCCL worker: under CPUOffloadPolicy the shards stay in pinned CPU memory, a training step
    leaves gradients and AdamW moments there too (nothing of the model on the GPU but its buffers),
    and the loss and gradient norm equal plain fsdp2's to fp32 rounding."""
    import copy

    from alignctl.workers.strategy import FSDP2Engine, build_optimizer

    base = _llama(hidden=256, vocab=1000)
    ids = torch.randint(0, 1000, (2, 16), generator=torch.Generator().manual_seed(0)).cuda()
    results = {}
    for offload in (True, False):  # offloaded first: no plain model on the GPU yet when memory is read
        model = copy.deepcopy(base)
        engine = FSDP2Engine(model if offload else model.cuda(), 1, offload=offload)
        engine.attach_optimizer(build_optimizer(list(model.parameters()), 1e-3, 0.0, [0.9, 0.999]), None)
        loss = engine.module(input_ids=ids, labels=ids).loss
        engine.backward(loss)
        norm = engine.step(grad_clip=0.5)
        torch.cuda.synchronize()
        local = [p.to_local() for p in model.parameters()]
        state = [t for s in engine.optimizer.state.values() for t in s.values() if t.dim() > 0]
        results[offload] = (float(loss), float(norm))
        if offload:
            assert all(t.device.type == "cpu" and t.is_pinned() for t in local)
            assert state and all(t.device.type == "cpu" for t in state)
            buffers = sum(b.numel() * b.element_size() for b in model.buffers())
            # cuBLAS keeps its matmul workspaces in the caching allocator; they are not the model's. On
            # an H200 this read 67,111,424 bytes (64 MiB + 2.5 KiB) without this line (2026-11-27).
            torch._C._cuda_clearCublasWorkspaces()
            assert torch.cuda.memory_allocated() < buffers + _weight_bytes(base) // 4
        else:
            assert all(t.device.type == "cuda" for t in local)
        del engine, model, local, state
    # The same loss; the gradient norm is summed on the CPU under offload and on the GPU without it, in
    # another order: an H200 read 7.322215 vs 7.322268 (7.2e-6 relative, 2026-11-27).
    assert results[True][0] == pytest.approx(results[False][0], rel=1e-6)
    assert results[True][1] == pytest.approx(results[False][1], rel=2e-5)


@needs_cuda
def test_hf_engine_sleep_returns_the_kv_cache_blocks_to_the_driver() -> None:
    """After generate the caching allocator still reserves the KV cache's blocks; sleep() hands
    them back: what stays reserved beyond the allocated weights is a fraction of the KV cache (the
    partly used segments the allocator cannot release)."""
    from alignctl.rollout import SamplingParams
    from alignctl.rollout.hf_engine import HFRolloutEngine

    model = _llama(hidden=256, vocab=1000).cuda()
    engine = HFRolloutEngine(model)
    engine.generate([[5] * 200] * 16, SamplingParams(n=4, max_new_tokens=64, seed=0, stop_token_ids=()))
    torch.cuda.synchronize()
    kv_bytes = 64 * (200 + 64) * 2 * 2 * 256 * 4  # rows x positions x (k, v) x layers x kv width x fp32
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() >= kv_bytes
    engine.sleep()
    assert torch.cuda.memory_reserved() - torch.cuda.memory_allocated() < kv_bytes // 4
