"""The tiny-model quickstart pipeline (pipelines/quickstart_tiny.yaml) end to end at reduced size (CI),
then again: every stage cached, < 10 s.

The full-size run is `alignctl run pipelines/quickstart_tiny.yaml` (the tiny character-model version of
the README's main command, which runs pipelines/quickstart.yaml on SmolLM2); this checks every stage's
wiring with the same file and only size overrides."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from alignctl.pipeline.runner import load, run_pipeline
from alignctl.pipeline.summary import print_summary
from conftest import REPO_ROOT

pytestmark = pytest.mark.slow

SMALL = [
    "data.arith.num_train=64", "data.arith.num_test=16", "data.arith.num_sft=64", "data.arith.num_pref=64",
    "sft.trainer.max_steps=3", "reward_model.trainer.max_steps=3",
    "ppo.trainer.total_training_steps=2", "ppo.data.train_batch_size=8", "ppo.data.max_val_samples=8",
    "grpo.trainer.total_training_steps=2", "grpo.data.train_batch_size=8", "grpo.data.max_val_samples=8",
    "grpo.actor_rollout_ref.actor.ppo_mini_batch_size=8",
    # 3 SFT steps leave the model answering nothing right: a flat first-batch reward is expected here
    "grpo.trainer.stop_on_flat_reward=false",
    "eval_ppo.max_prompts=8", "eval_grpo.max_prompts=8",
]


def test_quickstart_runs_end_to_end_then_is_fully_cached(tmp_path: Path, capsys):
    import ray

    spec = load(REPO_ROOT / "pipelines" / "quickstart_tiny.yaml", [*SMALL, f"workdir={tmp_path / 'work'}"])
    try:
        first = run_pipeline(spec)
    finally:
        ray.shutdown()
    assert [o.name for o in first] == ["data", "base_model", "sft", "reward_model", "ppo", "grpo", "eval_ppo", "eval_grpo"]
    assert {o.state for o in first} == {"ran"}
    by_name = {o.name: o for o in first}
    assert (by_name["ppo"].path / "actor" / "config.json").exists()
    ppo_rows = [json.loads(line) for line in (by_name["ppo"].path / "metrics.jsonl").read_text().splitlines()]
    assert any("critic/vf_loss" in r and "reward/rm_score/mean" in r for r in ppo_rows)  # critic + RM reward
    for name in ("eval_ppo", "eval_grpo"):
        results = json.loads((by_name[name].path / "results.json").read_text())
        assert 0.0 <= results["win_rate"] <= 1.0
        assert (by_name[name].path / "report.html").exists()
    assert "before" in " ".join(by_name["grpo"].metrics) and "after" in " ".join(by_name["grpo"].metrics)

    start = time.perf_counter()
    second = run_pipeline(load(REPO_ROOT / "pipelines" / "quickstart_tiny.yaml", [*SMALL, f"workdir={tmp_path / 'work'}"]))
    assert time.perf_counter() - start < 10
    assert {o.state for o in second} == {"cached"}
    print_summary(second)
    shown = capsys.readouterr().out
    assert "win rate" in shown and "report (eval_ppo)" in shown
