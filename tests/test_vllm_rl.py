"""The RL loop with vLLM generating inside the actor workers (the hybrid engine), on CPU: real Ray
workers and gloo groups, vLLM's CPU build, weight sync verified at every step.

Runs in .venv-vllm (scripts/setup.sh --with-vllm) with ``pytest -m vllm``.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from alignctl.errors import RunFailed
from rl_helpers import all_finite, launch_kill_driver, make_vllm_assets, read_metrics, rl_config

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

VLLM = ["actor_rollout_ref.rollout.name=vllm"]
TIME_DEPENDENT = ("timing_s/", "perf/")

LOSSY_ENGINE = '''
from alignctl.rollout import EngineCapabilities, EngineEntry, register_rollout_engine
from alignctl.rollout.vllm_engine import VLLMRolloutEngine


class LossyVLLM(VLLMRolloutEngine):
    """A planted bad sync: vLLM never receives one MLP weight."""

    def sync_weights(self, weights=None):
        super().sync_weights([(n, t) for n, t in weights if n != "model.layers.1.mlp.down_proj.weight"])


register_rollout_engine(EngineEntry("lossy_vllm", f"{__name__}:LossyVLLM", EngineCapabilities(sleep=True)))
'''


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny arith data and a char-level Llama with head_dim 64 (vLLM's CPU kernel refuses 16)."""
    return make_vllm_assets(tmp_path_factory.mktemp("vllm_rl"))


def _fit(cfg):
    import ray

    from alignctl.trainers.rl_factory import create_trainer

    try:
        return create_trainer(cfg).fit()
    finally:
        ray.shutdown()


def _assert_synced_every_step(rows: list[dict], steps: int) -> None:
    assert [r["step"] for r in rows] == list(range(1, steps + 1))
    for row in rows:
        assert all_finite(row)
        assert row["rollout/sync_probe_max_abs_diff"] <= 1e-5  # vLLM generated with the trained weights
        assert row["rollout/sleep_active"] == 0.0  # CPU: sleep unsupported, reported as such


def test_grpo_three_steps_one_worker(assets, tmp_path) -> None:
    run = tmp_path / "grpo"
    result = _fit(rl_config(assets, run, *VLLM, "algorithm.adv_estimator=grpo", "trainer.total_training_steps=3"))
    rows = read_metrics(run)
    assert result.steps == 3
    _assert_synced_every_step(rows, 3)
    assert any(abs(r["actor/pg_loss"]) > 0 for r in rows)  # real updates happened between the syncs


def test_ppo_with_a_critic_three_steps_two_fsdp2_workers(assets, tmp_path) -> None:
    """Two workers, each with its own vLLM; the actor's FSDP2 shards are gathered into full tensors
    for every sync (the probe confirms each worker's engine got the whole policy)."""
    run = tmp_path / "ppo"
    result = _fit(rl_config(assets, run, *VLLM, "algorithm.adv_estimator=gae", "trainer.total_training_steps=3",
                            "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=fsdp2"))
    rows = read_metrics(run)
    assert result.steps == 3 and all("critic/vf_loss" in r for r in rows)
    _assert_synced_every_step(rows, 3)


def test_lora_adapters_reach_vllm_merged(assets, tmp_path) -> None:
    """Under LoRA only the adapters train; the engine must generate with base + merged adapters,
    which the probe check confirms after each update (a stale-adapter sync would differ)."""
    run = tmp_path / "lora"
    _fit(rl_config(assets, run, *VLLM, "algorithm.adv_estimator=grpo", "trainer.total_training_steps=3",
                   "actor_rollout_ref.model.lora_rank=8", "actor_rollout_ref.model.target_modules=[q_proj,v_proj]",
                   "actor_rollout_ref.actor.optim.lr=5e-2"))
    _assert_synced_every_step(read_metrics(run), 3)


def test_a_planted_bad_sync_stops_the_run_naming_the_step(assets, tmp_path) -> None:
    """An engine registered by a plugin that skips one tensor: step 1 syncs the initial weights (the
    skipped one is still right), step 2 follows a real update, and the check stops the run there."""
    plugin = tmp_path / "lossy_engine.py"
    plugin.write_text(LOSSY_ENGINE)
    cfg = rl_config(assets, tmp_path / "lossy", f"algorithm.plugins=[{plugin}]", "actor_rollout_ref.rollout.name=lossy_vllm",
                    "algorithm.adv_estimator=grpo", "trainer.total_training_steps=3", "actor_rollout_ref.actor.optim.lr=1e-2")
    with pytest.raises(RunFailed, match=r"rollout weight sync before step 2 did not take.*tolerance 0.001") as err:
        _fit(cfg)
    assert "\n" not in str(err.value)
    assert [r["step"] for r in read_metrics(tmp_path / "lossy")] == [1]


def test_multi_turn_tool_calls_through_the_loop(tool_model_64, tmp_path) -> None:
    from alignctl.config import load_config
    from alignctl.config.rl import RLConfig

    run = tmp_path / "tools"
    cfg = load_config(RLConfig, None, [
        f"data.train_files=[{tool_model_64['data']}]", f"actor_rollout_ref.model.path={tool_model_64['model']}",
        f"trainer.run_dir={run}", "data.train_batch_size=2", "data.max_prompt_length=1024",
        "data.max_response_length=256", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.optim.lr=1e-4", "trainer.n_gpus_per_node=1",
        "trainer.logger=[jsonl]", "trainer.val_before_train=false", "data.shuffle=false",
        "actor_rollout_ref.rollout.temperature=0.2", "algorithm.adv_estimator=grpo", "trainer.total_training_steps=2",
        "actor_rollout_ref.rollout.multi_turn.enable=true", "actor_rollout_ref.rollout.multi_turn.max_turns=3",
        "actor_rollout_ref.rollout.multi_turn.valid_call_reward=0.1", *VLLM])
    _fit(cfg)
    rows = read_metrics(run)
    _assert_synced_every_step(rows, 2)
    # step 1 = prompts 0, 1 (a valid calculator call, a direct answer): the traces are followed
    assert rows[0]["multi_turn/calls/calculator"] == 2 and rows[0]["multi_turn/valid_call_share"] == 1.0


def test_sigkill_then_resume_equals_uninterrupted(assets, tmp_path) -> None:
    """The whole job is SIGKILLed after step 3's update and resumed from step 2's checkpoint: the
    metrics (timings aside) and final weights equal an uninterrupted run's exactly. vLLM draws each
    request from its own seed, so a fresh engine after the restart samples what the old one would."""
    from safetensors.torch import load_file

    def overrides(run_dir: Path) -> list[str]:
        return [f"data.train_files=[{assets['data'] / 'train.parquet'}]", f"actor_rollout_ref.model.path={assets['model']}",
                f"custom_reward_function.path={assets['reward']}", f"trainer.run_dir={run_dir}",
                "algorithm.adv_estimator=grpo", "data.train_batch_size=4", "data.max_prompt_length=128",
                "data.max_response_length=16", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.optim.lr=1e-3",
                "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.shuffle=true",
                "trainer.total_training_steps=4", "trainer.save_freq=1", "trainer.n_gpus_per_node=1",
                "trainer.logger=[jsonl]", "trainer.val_before_train=false", *VLLM]

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = launch_kill_driver("none", overrides(whole), timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    run = launch_kill_driver("mid_step:3", overrides(killed), timeout=600)
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    final = launch_kill_driver("none", overrides(killed), timeout=600)
    assert final.returncode == 0, final.stderr[-3000:]
    assert "resuming from" in final.stdout

    def deterministic(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith(TIME_DEPENDENT)} for r in rows]

    assert deterministic(read_metrics(killed)) == deterministic(read_metrics(whole))
    a, b = (load_file(str(p / "actor" / "model.safetensors")) for p in (whole, killed))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


POOL = ["trainer.pools.rollout_pool.workers_per_node=1", "trainer.placement.rollout=rollout_pool"]


@pytest.mark.parametrize(("estimator", "transport"), [("grpo", "object_store"), ("gae", "object_store"),
                                                      ("grpo", "collective")])
def test_a_rollout_pool_of_its_own_gets_the_weights_every_step(assets, tmp_path, estimator, transport) -> None:
    """vLLM in a rollout worker on its own pool, the actor training on the default pool: after every
    update the actor's weights reach the pool (through Ray's object store, or over the weight
    channel's gloo group; checked by the probe) and each batch records the policy version it was
    generated with: the update before its step."""
    run = tmp_path / estimator
    _fit(rl_config(assets, run, *VLLM, *POOL, f"algorithm.adv_estimator={estimator}",
                   "trainer.total_training_steps=3", f"actor_rollout_ref.rollout.weight_transport={transport}"))
    rows = read_metrics(run)
    _assert_synced_every_step(rows, 3)
    assert [r["rollout/policy_version"] for r in rows] == [0.0, 1.0, 2.0]
    # pushed once per update; step 1's weights went out already for the generation before it (baseline)
    assert all(r["timing_s/rollout_weight_sync"] > 0 for r in rows[1:])


def test_the_pool_placement_learns_what_the_colocated_one_does(assets, tmp_path) -> None:
    """Same seed: generation on a separate pool gives the colocated run's metrics (vLLM seeds each
    request, so the same samples, rewards and updates), timings and engine facts aside."""
    common = [*VLLM, "trainer.total_training_steps=2", "algorithm.adv_estimator=grpo"]
    _fit(rl_config(assets, tmp_path / "colocated", *common))
    _fit(rl_config(assets, tmp_path / "pool", *common, *POOL))

    def same(rows: list[dict]) -> list[dict]:
        return [{k: v for k, v in r.items() if not k.startswith((*TIME_DEPENDENT, "rollout/"))} for r in rows]

    assert same(read_metrics(tmp_path / "pool")) == same(read_metrics(tmp_path / "colocated"))
