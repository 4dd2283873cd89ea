"""Refuse to train on nothing: a run whose first batch got one reward for every response stops
at step 1 with a one-line error (exit 2), or only warns when the user says so (issue 20).
Real Ray workers, real rollouts of a tiny model; the reward function returns a constant."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import run_cli
from rl_helpers import make_assets, read_metrics

CONSTANT_REWARD = "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n    return 0.0\n"


@pytest.fixture(scope="module")
def assets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("flat")
    found = make_assets(root, num_train=16, num_test=4)
    (root / "zero.py").write_text(CONSTANT_REWARD)
    return {**found, "zero": root / "zero.py"}


def _args(assets: dict[str, Path], run_dir: Path, *extra: str) -> list[str]:
    return ["grpo", f"data.train_files=[{assets['data'] / 'train.parquet'}]",
            f"actor_rollout_ref.model.path={assets['model']}", f"custom_reward_function.path={assets['zero']}",
            f"trainer.run_dir={run_dir}", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.rollout.n=2", "data.max_response_length=8", "trainer.total_training_steps=2",
            "trainer.n_gpus_per_node=1", "trainer.logger=[jsonl]", "trainer.val_before_train=false", *extra]


def test_constant_first_batch_reward_stops_the_run(assets: dict[str, Path], tmp_path: Path) -> None:
    result = run_cli(*_args(assets, tmp_path / "run"))
    assert result.code == 2, result.stderr
    ours = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "every one of the 8 responses of the first batch got the same reward (0)" in ours[0]
    assert "trainer.stop_on_flat_reward=false" in ours[0]
    assert not (tmp_path / "run").exists()  # a refused new run leaves no folder (a rerun needs no --overwrite)
    from alignctl.workers.parked_groups import parked_pids

    assert parked_pids() == []  # only a run that ended cleanly leaves its workers for the next (reuse_workers)


def test_flat_reward_only_warns_when_asked(assets: dict[str, Path], tmp_path: Path) -> None:
    result = run_cli(*_args(assets, tmp_path / "run", "trainer.stop_on_flat_reward=false"))
    assert result.code == 0, result.stderr
    assert "got the same reward" in " ".join(result.stdout.split())
    assert [row["step"] for row in read_metrics(tmp_path / "run")] == [1, 2]
