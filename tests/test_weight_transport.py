"""``actor_rollout_ref.rollout.weight_transport=collective`` in the RL loop, real Ray workers, the tiny
model and the hf engine on a rollout pool of its own: the weights reach every rollout worker over
the weight channel (the probe check passes after every update), the run equals the object-store
run of the same seed, synchronous (FSDP2 shards, two receivers) and asynchronous; so the setting
stays out of the pipeline cache key (both transports produce the same artifact)."""

from __future__ import annotations

from pathlib import Path

import pytest

from alignctl.trainers.rl_factory import create_trainer
from rl_helpers import make_assets, read_metrics, rl_config, ray_session  # noqa: F401 - module fixture

pytestmark = pytest.mark.slow

COLLECTIVE = "actor_rollout_ref.rollout.weight_transport=collective"
OBJECT_STORE = "actor_rollout_ref.rollout.weight_transport=object_store"
TIME_DEPENDENT = ("timing_s/", "perf/")


def pool(workers: int) -> list[str]:
    return [f"trainer.pools.rollout_pool.workers_per_node={workers}", "trainer.placement.rollout=rollout_pool"]


@pytest.fixture(scope="module")
def assets(tmp_path_factory):
    return make_assets(tmp_path_factory.mktemp("weight_transport"), num_train=32, num_test=8)


def _deterministic(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(TIME_DEPENDENT)} for r in rows]


def test_the_channel_gives_the_object_store_run_to_two_rollout_workers(assets, tmp_path):
    """Two actor ranks (FSDP2: every rank gathers, rank 0 sends) and two rollout workers (two
    receivers): same seed, same metrics as the object-store transport, every update checked by the
    probe against the trainer's log-probs of it."""
    common = ["trainer.total_training_steps=3", "algorithm.adv_estimator=grpo", "trainer.n_gpus_per_node=2",
              "actor_rollout_ref.actor.strategy=fsdp2", "actor_rollout_ref.rollout.dtype=auto", *pool(2)]
    create_trainer(rl_config(assets, tmp_path / "store", *common, OBJECT_STORE)).fit()
    create_trainer(rl_config(assets, tmp_path / "channel", *common, COLLECTIVE)).fit()
    store, channel = read_metrics(tmp_path / "store"), read_metrics(tmp_path / "channel")
    assert len(channel) == 3
    assert _deterministic(channel) == _deterministic(store)
    assert [r["rollout/policy_version"] for r in channel] == [0.0, 1.0, 2.0]
    assert all(r["rollout/sync_probe_max_abs_diff"] <= 1e-5 for r in channel)
    assert all(r["timing_s/rollout_weight_sync"] > 0 for r in channel[1:])


def test_the_asynchronous_loop_on_the_channel_is_the_object_store_run(assets, tmp_path):
    """k = 1: the actor sends from a thread while the rollout worker may still be generating; the
    same seed gives the object-store run's metrics, the bound holds and is reached."""
    common = ["trainer.total_training_steps=4", "algorithm.adv_estimator=grpo", *pool(1),
              "trainer.async_rollout.max_staleness=1"]
    create_trainer(rl_config(assets, tmp_path / "store", *common, OBJECT_STORE)).fit()
    create_trainer(rl_config(assets, tmp_path / "channel", *common, COLLECTIVE)).fit()
    rows = read_metrics(tmp_path / "channel")
    assert len(rows) == 4
    assert _deterministic(rows) == _deterministic(read_metrics(tmp_path / "store"))
    assert all(r["rollout/staleness/max"] <= 1 for r in rows)
    assert max(r["rollout/staleness/max"] for r in rows) == 1


def test_the_transport_is_not_part_of_the_cache_key(tmp_path):
    from alignctl.pipeline.cache import stage_keys
    from alignctl.pipeline.spec import load_pipeline
    from alignctl.pipeline.stages import STAGE_KINDS

    def keys(*overrides: str) -> dict[str, str]:
        return stage_keys(load_pipeline(Path(__file__).resolve().parents[1] / "pipelines" / "quickstart.yaml", list(overrides), set(STAGE_KINDS)))

    default = keys()
    assert keys(f"grpo.{OBJECT_STORE}") == default == keys(f"grpo.{COLLECTIVE}")
    assert keys("grpo.actor_rollout_ref.rollout.n=3")["grpo"] != default["grpo"]  # a setting that is in it
