"""The monitor watches a run; it never changes it. Its baseline samples the reference policy before
step 1 (its own prompts, the training sampling settings), so it must draw from no random stream the
run itself uses: the same seed gives the same training numbers with the baseline on or off.

GRPO and PPO (critic) on the tiny model, 2 sampled steps each, metric histories compared key by key
except the monitor's own keys and wall-clock timings."""

from __future__ import annotations

from pathlib import Path

import pytest

from rl_helpers import make_assets, read_metrics, rl_config

CLOCK_PREFIXES = ("timing_s/", "perf/", "monitor/")


def _training_numbers(row: dict[str, object]) -> dict[str, float]:
    return {k: v for k, v in row.items() if isinstance(v, (int, float)) and not k.startswith(CLOCK_PREFIXES)}


def _history(assets: dict[str, Path], run: Path, *overrides: str) -> list[dict[str, float]]:
    import ray

    from alignctl.trainers.rl_factory import create_trainer

    try:
        create_trainer(rl_config(assets, run, "trainer.total_training_steps=2", "trainer.stop_on_flat_reward=false",
                                 *overrides)).fit()
    finally:
        ray.shutdown()
    return [_training_numbers(row) for row in read_metrics(run)]


@pytest.mark.slow
@pytest.mark.parametrize("estimator", ["grpo", "gae"])
def test_the_baseline_leaves_every_training_number_unchanged(tmp_path: Path, estimator: str):
    assets = make_assets(tmp_path / "assets", num_train=32, num_test=4)
    common = (f"algorithm.adv_estimator={estimator}", "trainer.seed=3")
    watched = _history(assets, tmp_path / "watched", *common, "monitor.baseline_prompts=8")
    unwatched = _history(assets, tmp_path / "unwatched", *common, "monitor.baseline_prompts=0")
    assert (tmp_path / "watched" / "monitor_baseline.json").exists()
    assert not (tmp_path / "unwatched" / "monitor_baseline.json").exists()
    assert len(watched) == len(unwatched) == 2
    for step, (a, b) in enumerate(zip(watched, unwatched), 1):
        assert a.keys() == b.keys(), (step, sorted(a.keys() ^ b.keys()))
        differing = {k: (a[k], b[k]) for k in a if a[k] != b[k]}
        assert not differing, (step, differing)
