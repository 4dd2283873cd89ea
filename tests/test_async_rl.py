"""Asynchronous RL (``trainer.async_rollout.max_staleness`` k) on the tiny model, hf engine: a rollout
pool of its own generates ahead while the actor pool trains, with real Ray workers.

k = 0 equals the synchronous colocated loop; the bound (global_step - version <= k) holds on every
trained response and is reached; a schedule that breaks it is caught; a SIGKILL between checkpoints
resumes onto the queued batches exactly; PPO with a critic, DAPO and multi-turn tool rollouts run
async; with staleness the old log-probs are the trainer's, not the engine's.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch

from alignctl.config import load_config
from alignctl.config.rl import RLConfig
from alignctl.errors import UserError
from alignctl.trainers.rl_trainer import RLTrainer
from alignctl.trainers.rollout_queue import RolloutQueue, check_staleness
from rl_helpers import all_finite, launch_kill_driver, make_assets, read_metrics, rl_config, ray_session  # noqa: F401 - module fixture

pytestmark = pytest.mark.slow

POOL = ["trainer.pools.rollout_pool.workers_per_node=1", "trainer.placement.rollout=rollout_pool"]
TIME_DEPENDENT = ("timing_s/", "perf/")


def staleness(k: int) -> list[str]:
    return [*POOL, f"trainer.async_rollout.max_staleness={k}"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("async_rl"), num_train=32, num_test=8)


class Recording(RLTrainer):
    """Keeps (global step, every trained response's policy version) of each step."""

    def __init__(self, cfg: RLConfig) -> None:
        super().__init__(cfg)
        self.trained: list[tuple[int, list[int]]] = []

    def step_rollout_metrics(self, batch):
        self.trained.append((self.global_step, batch["policy_version"].tolist()))
        return super().step_rollout_metrics(batch)


def _without(rows: list[dict], prefixes: tuple[str, ...]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(prefixes)} for r in rows]


@pytest.mark.parametrize("estimator", ["grpo", "dapo"])
def test_staleness_zero_is_the_synchronous_loop(assets, tmp_path, estimator):
    """Same seed: k = 0 on a rollout pool of its own (the queue, one batch submitted and awaited)
    gives the colocated synchronous loop's metrics, every one but timings and the pool's own facts."""
    from alignctl.trainers.rl_factory import create_trainer

    extra = ["algorithm.filter_groups.enable=true", "actor_rollout_ref.actor.clip_ratio_high=0.28"] \
        if estimator == "dapo" else []
    common = ["trainer.total_training_steps=3", "algorithm.adv_estimator=grpo", *extra]
    create_trainer(rl_config(assets, tmp_path / "sync", *common)).fit()
    create_trainer(rl_config(assets, tmp_path / "k0", *common, *staleness(0))).fit()
    sync, k0 = read_metrics(tmp_path / "sync"), read_metrics(tmp_path / "k0")
    assert len(sync) == 3
    assert _without(k0, (*TIME_DEPENDENT, "rollout/")) == _without(sync, (*TIME_DEPENDENT, "rollout/"))
    lengths = ("rollout/generated_length/mean", "rollout/trained_length/mean")
    assert [[r[key] for key in lengths] for r in k0] == [[r[key] for key in lengths] for r in sync]
    assert all(r["rollout/staleness/max"] == 0 for r in k0)
    assert [r["rollout/policy_version"] for r in k0] == [0.0, 1.0, 2.0]


@pytest.mark.parametrize("k", [1, 2])
def test_the_bound_holds_on_every_trained_response_and_is_reached(assets, tmp_path, k):
    """Every trained response was sampled at most k updates before its step; from step k + 1 on the
    pool runs exactly k versions ahead (the overlap the mode exists for). Nothing is dropped: the
    responses generated for a step are the ones trained."""
    trainer = Recording(rl_config(assets, tmp_path / "run", "trainer.total_training_steps=5", *staleness(k)))
    trainer.fit()
    assert [step for step, _ in trainer.trained] == [0, 1, 2, 3, 4]
    for step, versions in trainer.trained:
        assert len(versions) == 8 and all(0 <= step - v <= k for v in versions)
        assert all(step - v == min(step, k) for v in versions)
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/staleness/max"] for r in rows] == [float(min(s, k)) for s in range(5)]
    assert all(r["rollout/generated_length/mean"] == r["rollout/trained_length/mean"] == r["response_length/mean"]
               for r in rows)
    assert all(r["timing_s/wait_rollout"] >= 0 and r["timing_s/wait_train"] >= 0 for r in rows)
    assert all(all_finite(r) for r in rows)


def test_a_schedule_that_runs_too_far_ahead_is_stopped_before_training(assets, tmp_path, monkeypatch):
    """The assertion is real: a queue topped up one batch deeper than k allows delivers a batch two
    updates old at k = 1, and the step refuses it before any update."""
    monkeypatch.setattr(RolloutQueue, "wants_more",
                        lambda self, step, total: len(self.items) <= self.max_staleness + 1 and step + len(self.items) < total)
    trainer = Recording(rl_config(assets, tmp_path / "run", "trainer.total_training_steps=4", *staleness(1)))
    with pytest.raises(RuntimeError, match="staleness 2 > max_staleness 1"):
        trainer.fit()
    assert [step for step, _ in trainer.trained][-1] == 2


def test_check_staleness_by_hand():
    versions = torch.tensor([3, 2, 2, 1])
    assert check_staleness(versions, 3, 2).tolist() == [0, 1, 1, 2]
    with pytest.raises(RuntimeError, match="staleness 2 > max_staleness 1"):
        check_staleness(versions, 3, 1)
    with pytest.raises(RuntimeError, match="newer than the trainer"):
        check_staleness(torch.tensor([4]), 3, 1)


def test_with_staleness_the_old_log_probs_are_the_trainers(assets, tmp_path):
    """k = 1, rollout correction on: step 1's batch is fresh (engine and trainer agree to float
    rounding); later batches come from the previous weights, so the recomputed old log-probs (the
    trainer's current policy) differ from the engine's and the importance weights act on the gap."""
    rows = _fit_rows(assets, tmp_path, "trainer.total_training_steps=3", *staleness(1),
                     "algorithm.rollout_correction.mode=token_tis", "algorithm.rollout_correction.cap=2.0")
    assert rows[0]["rollout/staleness/max"] == 0 and rows[0]["rollout/log_prob_diff_max"] < 1e-5
    for row in rows[1:]:
        assert row["rollout/staleness/max"] == 1
        assert row["rollout/log_prob_diff_mean"] > 1e-3  # lr 1e-3 moves the tiny policy visibly in one step
        assert row["rollout_corr/kl"] > 0 or row["rollout_corr/k3_kl"] > 0


def test_ppo_with_a_critic_runs_async_and_validates_between_queued_batches(assets, tmp_path):
    """PPO (critic values and update) one version behind; validation after step 2 generates on the
    rollout pool behind the queued batch, with the newest weights, and leaves the schedule as it was."""
    rows = _fit_rows(assets, tmp_path, "trainer.total_training_steps=3", "algorithm.adv_estimator=gae", *staleness(1),
                     f"data.val_files=[{assets['data'] / 'test.parquet'}]", "trainer.test_freq=2")
    steps = [r for r in rows if "rollout/staleness/max" in r]
    assert [r["rollout/staleness/max"] for r in steps] == [0.0, 1.0, 1.0]
    assert [r["rollout/policy_version"] for r in steps] == [0.0, 0.0, 1.0]
    assert all(all_finite(r) and r["critic/vf_loss"] > 0 for r in steps)
    assert [r["step"] for r in rows if any(k.startswith("val-core/") for k in r)] == [2, 3]


def test_dapo_rounds_come_from_the_queue_within_the_bound(assets, tmp_path):
    """DAPO's extra generation rounds take the next queued batches too (so a step may train
    fresher responses than k allows, never staler); every generated round is counted."""
    from alignctl.trainers.dapo import DAPOTrainer

    class RecordingDAPO(DAPOTrainer, Recording):
        pass

    coarse = tmp_path / "first_digit.py"  # 0/1 scores: many groups of two score alike, so steps need extra rounds
    coarse.write_text("def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                      "    return float(solution_str[:1].isdigit())\n")
    cfg = rl_config(assets, tmp_path / "run", "trainer.total_training_steps=3", "algorithm.filter_groups.enable=true",
                    f"custom_reward_function.path={coarse}", "trainer.stop_on_flat_reward=false", *staleness(1))
    trainer = RecordingDAPO(cfg)
    trainer.fit()
    rows = read_metrics(tmp_path / "run")
    assert any(r["dapo/num_gen_batches"] > 1 for r in rows)
    for step, versions in trainer.trained:
        assert all(0 <= step - v <= 1 for v in versions)
    assert all(r["rollout/staleness/max"] <= 1 and all_finite(r) for r in rows)
    assert all(r["rollout/generated_length/mean"] > 0 for r in rows)


def _fit_rows(assets, tmp_path: Path, *overrides: str) -> list[dict]:
    RLTrainer(rl_config(assets, tmp_path / "run", *overrides)).fit()
    return read_metrics(tmp_path / "run")


def test_sigkill_mid_queue_resumes_onto_the_queued_batches(assets, tmp_path):
    """k = 1, a checkpoint every step, the whole job killed after step 3's update (the batch of
    step 4, generated by version 2, is queued): the resumed run trains the checkpoint's queued batch
    (stored with it) and ends with the uninterrupted run's metrics and weights exactly."""
    from safetensors.torch import load_file

    def overrides(run: Path) -> list[str]:
        return [f"data.train_files=[{assets['data'] / 'train.parquet'}]", f"actor_rollout_ref.model.path={assets['model']}",
                f"trainer.run_dir={run}", f"custom_reward_function.path={assets['reward']}",
                "data.train_batch_size=4", "data.max_response_length=16", "actor_rollout_ref.rollout.n=2",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.optim.lr=1e-3",
                "trainer.total_training_steps=5", "trainer.n_gpus_per_node=1", "trainer.logger=[jsonl]",
                "trainer.val_before_train=false", "trainer.save_freq=1", "monitor.baseline_prompts=0", *staleness(1)]

    whole, killed = tmp_path / "whole", tmp_path / "killed"
    RLTrainer(load_config(RLConfig, None, overrides(whole))).fit()  # uninterrupted, in this process
    run = launch_kill_driver("mid_step:3", overrides(killed))
    assert run.returncode == -signal.SIGKILL, run.stderr[-3000:]
    assert (killed / "checkpoints" / "global_step_2" / "rollout_queue.pt").exists()
    final = launch_kill_driver("none", overrides(killed))
    assert final.returncode == 0, final.stdout[-2000:] + final.stderr[-4000:]
    assert "resuming from" in final.stdout
    rows = read_metrics(killed)
    assert [r["rollout/staleness/max"] for r in rows] == [0.0, 1.0, 1.0, 1.0, 1.0]
    assert _without(rows, TIME_DEPENDENT) == _without(read_metrics(whole), TIME_DEPENDENT)
    a, b = (load_file(str(p / "actor" / "model.safetensors")) for p in (whole, killed))
    assert a.keys() == b.keys() and all(torch.equal(a[key], b[key]) for key in a)


def test_multi_turn_tool_rollouts_run_async(tool_model, tmp_path):
    """Tool-using trajectories generated on the rollout pool one version ahead: the tools ran (calls,
    tool rewards) and the bound held."""
    from test_multi_turn_rl import MULTI_TURN

    cfg = load_config(RLConfig, None, [
        f"data.train_files=[{tool_model['data']}]", f"actor_rollout_ref.model.path={tool_model['model']}",
        f"trainer.run_dir={tmp_path / 'run'}", "data.train_batch_size=2", "data.max_prompt_length=1024",
        "data.max_response_length=256", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.optim.lr=1e-4", "trainer.n_gpus_per_node=1",
        "trainer.logger=[jsonl]", "trainer.val_before_train=false", "data.shuffle=false",
        "actor_rollout_ref.rollout.temperature=0.2", "trainer.total_training_steps=3", "monitor.baseline_prompts=0",
        *MULTI_TURN, *staleness(1)])
    RLTrainer(cfg).fit()
    rows = read_metrics(tmp_path / "run")
    assert [r["rollout/staleness/max"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(all_finite(r) and r["multi_turn/calls_per_sample"] > 0 for r in rows)
    # step 1 = prompts 0, 1 (a valid calculator call, a direct answer), as in the synchronous test
    assert rows[0]["multi_turn/calls/calculator"] == 2 and rows[0]["multi_turn/valid_call_share"] == 1.0


def test_async_without_a_rollout_pool_is_refused_before_ray(assets, tmp_path):
    with pytest.raises(UserError, match="'trainer.async_rollout.max_staleness' \\(1\\) needs a rollout pool"):
        rl_config(assets, tmp_path / "run", "trainer.async_rollout.max_staleness=1")
    with pytest.raises(UserError, match="recompute_old_log_prob=true"):
        rl_config(assets, tmp_path / "run", *staleness(2), "actor_rollout_ref.actor.recompute_old_log_prob=false")
    assert not (tmp_path / "run").exists()


def test_the_benchmark_reads_pipeline_evals_and_standalone_eval_folders(tmp_path: Path):
    """benchmarks/async_rl.py --workdirs: an eval_grpo stage of a pipeline workdir and an `alignctl
    eval --policy <grpo>/actor` output folder each name the GRPO run they evaluated; the arm carries
    its staleness bound, accuracies, wall time and mean lengths (by hand: (24 + 26) / 2 = 25)."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("async_rl_bench", Path(__file__).resolve().parents[1] / "benchmarks" / "async_rl.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)

    def grpo(name: str, k: int | None) -> Path:
        folder = tmp_path / name
        folder.mkdir(parents=True)
        trainer = {} if k is None else {"async_rollout": {"max_staleness": k}}
        (folder / "manifest.json").write_text(json.dumps({"config": {"trainer": trainer}, "wall_time_s": 600.4}))
        rows = [{"step": s, "rollout/trained_length/mean": v, "rollout/generated_length/mean": v} for s, v in ((1, 24.0), (2, 26.0))]
        (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return folder

    metrics = {"accuracy/arith/pass@1": 0.7, "reference_accuracy/arith/pass@1": 0.48}
    workdir = tmp_path / "workdir"
    sync = grpo("workdir/grpo-aaa", None)
    (workdir / "eval_grpo-bbb").mkdir()
    (workdir / "eval_grpo-bbb" / "manifest.json").write_text(json.dumps(
        {"stage": "eval_grpo", "inputs": {"grpo": str(sync)}, "metrics": metrics}))
    async_run = grpo("async/grpo-ccc", 1)
    (tmp_path / "async_eval").mkdir()
    (tmp_path / "async_eval" / "manifest.json").write_text(json.dumps(
        {"stage": "eval", "inputs": {"policy": str(async_run / "actor")}, "metrics": metrics}))
    (k0,) = bench.grpo_arms(workdir)
    (k1,) = bench.grpo_arms(tmp_path / "async_eval")
    assert (k0["grpo"], k0["max_staleness"], k1["grpo"], k1["max_staleness"]) == ("grpo-aaa", 0, "grpo-ccc", 1)
    assert k1["accuracy"] == 0.7 and k1["sft_accuracy"] == 0.48 and k1["grpo_wall_s"] == 600
    assert k1["generated_length"] == k1["trained_length"] == 25.0
