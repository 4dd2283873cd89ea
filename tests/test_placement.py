"""Roles on named resource pools (trainer.pools / trainer.placement): the checks before Ray starts,
the fit against a cluster, PPO with actor, critic and reward model in three pools on a simulated
three-node cluster (equal to the one-pool run), and a real two-raylet `ray start` cluster joined by
address, including a worker killed on one node."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from alignctl.errors import UserError
from alignctl.workers.group import ResourcePool
from alignctl.workers.pooled_workers import check_fit
from conftest import assert_user_error, run_cli
from rl_helpers import make_assets, read_metrics, rl_config

# ---------------------------------------------------------------------------------- checks (no Ray)

THREE_POOLS = ("algorithm.adv_estimator=gae", "trainer.pools.actor_pool.workers_per_node=1",
               "trainer.pools.critic_pool.workers_per_node=1", "trainer.pools.rm_pool.workers_per_node=1",
               "trainer.placement.actor=actor_pool", "trainer.placement.critic=critic_pool",
               "trainer.placement.rm=rm_pool")


def _config(tmp_path: Path, *overrides: str):
    assets = {"data": tmp_path, "model": tmp_path / "model", "reward": tmp_path / "r.py"}
    return rl_config(assets, tmp_path / "run", *overrides)


def test_default_is_one_hybrid_pool_and_pools_resolve_from_trainer_keys(tmp_path):
    from alignctl.config.placement import pool_shapes

    cfg = _config(tmp_path, "algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=2")
    shapes = pool_shapes(cfg.trainer, cfg.roles)
    assert list(shapes) == ["global_pool"] and shapes["global_pool"].world_size == 2
    assert shapes["global_pool"].strategy == "PACK"
    cfg = _config(tmp_path, "algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=2", "trainer.nnodes=2",
                  "trainer.pools.critic_pool.workers_per_node=1", "trainer.pools.critic_pool.nnodes=1",
                  "trainer.placement.critic=critic_pool")
    shapes = pool_shapes(cfg.trainer, cfg.roles)
    # the default pool spans the two nodes it was asked for: one bundle per node, STRICT_SPREAD
    assert (shapes["global_pool"].world_size, shapes["global_pool"].strategy) == (4, "STRICT_SPREAD")
    assert (shapes["critic_pool"].world_size, shapes["critic_pool"].strategy) == (1, "PACK")
    assert (cfg.world_size("actor"), cfg.world_size("critic")) == (4, 1)
    pool = ResourcePool(4, cpus=2, name="p", nnodes=2, strategy="STRICT_SPREAD", resources={"big": 0.5})
    assert pool.bundles() == [{"CPU": 4.0, "big": 1.0}] * 2 and [pool.bundle_of(r) for r in range(4)] == [0, 0, 1, 1]


def test_cpus_per_worker_auto_shares_this_machines_cores_among_one_nodes_workers(tmp_path):
    from alignctl.config.placement import auto_cpus_per_worker, pool_shapes
    from alignctl.cores import available_cores

    # By hand: cores // workers on a node, at least 1.
    assert [auto_cpus_per_worker(w, cores=16) for w in (1, 2, 3, 4, 32)] == [16, 8, 5, 4, 1]
    cores = available_cores()  # this process's affinity mask: every core unless pinned
    cfg = _config(tmp_path, "algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=2", "trainer.cpus_per_worker=auto")
    assert pool_shapes(cfg.trainer, cfg.roles)["global_pool"].cpus == max(1, cores // 2)
    # Three pools: 2 + 1 + 1 workers counted together; a pool's own number is kept.
    cfg = _config(tmp_path, *THREE_POOLS, "reward_model.enable=true", "reward_model.model.path=rm",
                  "trainer.pools.actor_pool.workers_per_node=2", "trainer.pools.rm_pool.cpus_per_worker=3",
                  "trainer.cpus_per_worker=auto")
    shapes = pool_shapes(cfg.trainer, cfg.roles)
    assert [shapes[p].cpus for p in ("actor_pool", "critic_pool", "rm_pool")] == [max(1, cores // 4)] * 2 + [3]
    for bad, needle in (("0", "expected an integer >= 1, got 0"), ("many", "expected int or one of 'auto'")):
        with pytest.raises(UserError, match=needle):
            _config(tmp_path, f"trainer.cpus_per_worker={bad}")


@pytest.mark.parametrize("overrides, needles", [
    (("trainer.placement.critic=nope",), ("trainer.placement.critic", "'nope'", "not defined")),
    (("trainer.pools.spare.workers_per_node=1",), ("trainer.pools.spare", "no role is placed on it")),
    ((*THREE_POOLS, "trainer.pools.critic_pool.workers_per_node=3"),
     ("critic.ppo_mini_batch_size x rollout.n (8)", "critic workers in trainer.pools.critic_pool (3)")),
    ((*THREE_POOLS, "trainer.pools.actor_pool.workers_per_node=3"),
     ("data.train_batch_size (4)", "actor workers in trainer.pools.actor_pool (3)")),
    ((*THREE_POOLS, "reward_model.enable=true", "reward_model.model.path=rm", "trainer.pools.rm_pool.workers_per_node=3"),
     ("data.train_batch_size (4)", "rm workers in trainer.pools.rm_pool (3)")),
    (("trainer.nnodes=2", "trainer.pools.global_pool.strategy=STRICT_PACK"),
     ("trainer.pools.global_pool.strategy", "STRICT_PACK", "2 nodes")),
    (("trainer.pools.p.resources={CPU: 1}", "trainer.placement.critic=p"), ("trainer.pools.p.resources.CPU",)),
    (("trainer.pools.p.wrkers_per_node=1",), ("unknown config key 'trainer.pools.p.wrkers_per_node'",)),
])
def test_placement_mistakes_are_one_line_errors_before_ray_starts(tmp_path, overrides, needles):
    with pytest.raises(UserError) as info:
        _config(tmp_path, *overrides)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_fit_is_checked_against_each_node():
    one_node = [{"CPU": 8.0}]
    spread = {"global_pool": ResourcePool(2, name="global_pool", nnodes=2, strategy="STRICT_SPREAD")}
    with pytest.raises(UserError, match=r"key 'trainer.nnodes': pool 'global_pool' needs 2 workers x \(1 CPU\) on "
                                        r"2 node\(s\), STRICT_SPREAD; here has 1 node\(s\): 8 CPU"):
        check_fit(spread, one_node, {"global_pool": "trainer.nnodes"}, "here")
    check_fit(spread, [{"CPU": 1.0}, {"CPU": 1.0}], {"global_pool": "trainer.nnodes"}, "here")
    pools = {"a": ResourcePool(2, cpus=2, name="a"), "b": ResourcePool(1, cpus=2, name="b")}
    with pytest.raises(UserError, match=r"the pools together need 6 CPU .*; here has 5 CPU in all"):
        check_fit(pools, [{"CPU": 3.0}, {"CPU": 2.0}], {"a": "trainer.pools.a", "b": "trainer.pools.b"}, "here")
    pinned = {"a": ResourcePool(1, name="a", resources={"node_c": 1})}
    with pytest.raises(UserError, match="trainer.pools.a"):
        check_fit(pinned, [{"CPU": 4.0, "node_a": 1.0}], {"a": "trainer.pools.a"}, "here")
    check_fit(pinned, [{"CPU": 4.0, "node_a": 1.0}, {"CPU": 1.0, "node_c": 1.0}], {"a": "trainer.pools.a"}, "here")


def test_benchmark_overlap_counts_seconds_both_pools_ran_at_once():
    """benchmarks/placement.py's per-phase overlap, by hand: the actor's log-prob passes [0, 2] and
    [2, 3] against critic values [1, 4] overlap 1 + 1 = 2 s; the shorter side (actor) ran 3 s."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
    from placement import phase_overlap

    actor = [("actor", "compute_log_prob", 0.0, 2.0), ("actor", "compute_ref_log_prob", 2.0, 3.0),
             ("actor", "update_actor", 5.0, 9.0)]
    critic = [("critic", "compute_values", 1.0, 4.0), ("critic", "update_critic", 9.0, 10.0)]
    forward = phase_overlap(actor, critic, ("compute_log_prob", "compute_ref_log_prob"), ("compute_values",))
    assert forward == {"overlap_s": 2.0, "fraction": pytest.approx(2 / 3, abs=1e-12)}
    assert phase_overlap(actor, critic, ("update_actor",), ("update_critic",)) == {"overlap_s": 0.0, "fraction": 0.0}


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("placement"))


def test_a_pool_spanning_nodes_on_a_local_cluster_exits_2_before_ray_starts(assets, tmp_path, monkeypatch):
    """A local Ray cluster is one node: STRICT_SPREAD over two cannot be placed; refused up front."""
    import ray

    # The local path is under test. A Ray session an earlier file left connected is ended by conftest's
    # per-file fixture; a RAY_ADDRESS set in the environment the tests run in would still take the
    # join-a-cluster path.
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    result = run_cli("grpo", f"data.train_files=[{assets['data'] / 'train.parquet'}]",
                     f"actor_rollout_ref.model.path={assets['model']}", f"custom_reward_function.path={assets['reward']}",
                     f"trainer.run_dir={tmp_path / 'run'}", "data.train_batch_size=4", "actor_rollout_ref.rollout.n=2",
                     "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.nnodes=2")
    assert_user_error(result, "key 'trainer.nnodes'", "STRICT_SPREAD", "a local Ray cluster is one node")
    assert not ray.is_initialized() and not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------- a simulated cluster


def _reward_model(root: Path, model: Path) -> Path:
    """A reward model with a fixed, seeded score head (a causal-LM folder would get a fresh random
    head in each process that loads it, so two runs could not be compared)."""
    import torch

    from alignctl.models.loading import load_reward_model, load_tokenizer

    torch.manual_seed(0)
    rm = load_reward_model(model)
    out = root / "rm"
    rm.save_pretrained(out)
    load_tokenizer(model, padding_side="left").save_pretrained(out)
    return out


def _comparable(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in row.items() if not k.startswith(("timing_s/", "perf/"))} for row in rows]


@pytest.mark.slow
@pytest.mark.timeout(400)
def test_three_pools_on_three_nodes_place_as_configured_and_equal_one_pool(assets, tmp_path):
    """Actor+rollout+ref, critic and reward model in three pools, each pinned by a custom resource to
    its own raylet of a simulated three-node cluster: every worker reports the node and pool it ran
    on, as configured; the 3-step PPO run (KL in reward: old and reference log-probs, critic values,
    RM scores all run) equals the one-pool run with the same seed exactly (fp32 CPU, tolerance 0:
    the same single-threaded kernels on the same inputs, only in other processes)."""
    import ray

    from alignctl.trainers.rl_trainer import RLTrainer
    from ray_cluster_helpers import simulated_cluster

    if ray.is_initialized():
        pytest.skip("needs this process to have no Ray connection (another module left one open)")
    rm = _reward_model(tmp_path, assets["model"])
    common = ("algorithm.adv_estimator=gae", "algorithm.use_kl_in_reward=true", "reward_model.enable=true",
              f"reward_model.model.path={rm}", "reward_model.rule_weight=0.5", "trainer.total_training_steps=3",
              "trainer.seed=5")
    pinned = [f"trainer.pools.{pool}.resources={{{node}: 1}}"
              for pool, node in (("actor_pool", "node_a"), ("critic_pool", "node_b"), ("rm_pool", "node_c"))]
    nodes = [{"node_a": 1}, {"node_b": 1}, {"node_c": 1}]
    with simulated_cluster(nodes, num_cpus=1) as cluster:
        node_of = {next(r for r in n["Resources"] if r.startswith("node_")): n["NodeID"] for n in ray.nodes()}
        assert len(set(node_of.values())) == 3
        RLTrainer(rl_config(assets, tmp_path / "pools", *common, *THREE_POOLS, *pinned)).fit()
        workers = json.loads((tmp_path / "pools" / "workers.json").read_text())
        placed = {(w["pool"], tuple(w["roles"]), w["node_id"]) for w in workers}
        assert placed == {("actor_pool", ("actor",), node_of["node_a"]), ("critic_pool", ("critic",), node_of["node_b"]),
                          ("rm_pool", ("rm",), node_of["node_c"])}
        # the same run in the default single pool (every role in one worker process)
        RLTrainer(rl_config(assets, tmp_path / "one", *common)).fit()
        single = json.loads((tmp_path / "one" / "workers.json").read_text())
        assert [(w["pool"], w["roles"]) for w in single] == [("global_pool", ["actor", "critic", "rm"])]
        assert cluster.head_node is not None
    pooled, one = _comparable(read_metrics(tmp_path / "pools")), _comparable(read_metrics(tmp_path / "one"))
    assert [r["step"] for r in pooled] == [1, 2, 3]
    assert pooled[0]["critic/vf_loss"] > 0 and pooled[0]["reward/rm_score/mean"] != 0
    for a, b in zip(pooled, one):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == b[key], (key, a[key], b[key])


# ---------------------------------------------------------------------------------- a `ray start` cluster


def _ppo_args(assets: dict[str, Path], run_dir: Path, address: str, steps: int) -> list[str]:
    return [sys.executable, "-m", "alignctl", "ppo", f"data.train_files=[{assets['data'] / 'train.parquet'}]",
            f"actor_rollout_ref.model.path={assets['model']}", f"custom_reward_function.path={assets['reward']}",
            f"trainer.run_dir={run_dir}", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=2", "data.max_response_length=16", "algorithm.adv_estimator=gae",
            f"trainer.total_training_steps={steps}", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
            f"trainer.ray_address={address}", "trainer.nnodes=2", "trainer.n_gpus_per_node=1"]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_ppo_joins_a_two_raylet_ray_start_cluster_and_names_a_killed_workers_node(assets, tmp_path):
    """`ray start` head + worker node on 127.0.0.1 (1 CPU each, nothing listening elsewhere):
    `alignctl ppo trainer.ray_address=... trainer.nnodes=2` spreads its pool over both raylets and
    finishes; then a run whose rank-1 worker is SIGKILLed exits 1 naming that worker's node, role
    and step."""
    from ray_cluster_helpers import RayStartCluster

    cluster = RayStartCluster([{"node_a": 1}, {"node_b": 1}], num_cpus=1)
    try:
        done = subprocess.run(_ppo_args(assets, tmp_path / "ok", cluster.address, 2), capture_output=True,
                              text=True, env=cluster.env, timeout=300)
        assert done.returncode == 0, done.stderr[-3000:]
        assert [r["step"] for r in read_metrics(tmp_path / "ok")] == [1, 2]
        workers = json.loads((tmp_path / "ok" / "workers.json").read_text())
        assert len({w["node_id"] for w in workers}) == 2 and [w["roles"] for w in workers] == [["actor", "critic"]] * 2
        message = _kill_rank1_mid_run(assets, tmp_path / "killed", cluster)
    finally:
        cluster.stop()
    assert not cluster.pids()
    dead = message["worker"]
    print(f"\n{message['line']}")
    assert message["line"].startswith("error: step "), message["line"]
    assert "worker process died during" in message["line"], message["line"]
    assert f"on node 127.0.0.1 [{dead['node_id'][:12]}], pool global_pool rank 1" in message["line"], message["line"]
    assert any(f"'{role}' worker" in message["line"] for role in dead["roles"]), message["line"]
    assert message["outside_loopback"] == []


def _kill_rank1_mid_run(assets: dict[str, Path], run_dir: Path, cluster) -> dict:
    from ray_cluster_helpers import listeners_outside_loopback

    proc = subprocess.Popen(_ppo_args(assets, run_dir, cluster.address, 1000), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cluster.env)
    try:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.time() + 180
        while time.time() < deadline and not (metrics.exists() and metrics.read_text().count("\n") >= 1):
            time.sleep(0.5)
        assert metrics.exists(), "the run never finished step 1"
        outside = listeners_outside_loopback([*cluster.pids(), proc.pid])
        worker = json.loads((run_dir / "workers.json").read_text())[1]
        os.kill(worker["pid"], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1, stderr[-3000:]
    ours = [line for line in stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1, stderr[-3000:]
    return {"line": ours[0], "worker": worker, "outside_loopback": outside}
