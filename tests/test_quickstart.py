"""The tiny-model quickstart pipeline (pipelines/quickstart_tiny.yaml) end to end at reduced size (CI),
then again: every stage cached, < 10 s.

The full-size run is `alignctl run pipelines/quickstart_tiny.yaml` (the tiny character-model version of
the README's main command, which runs pipelines/quickstart.yaml on SmolLM2); this checks every stage's
wiring with the same file and only size overrides."""

from __future__ import annotations

import json
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

    # every stage "cached" means no stage ran a step (no wall-clock bound: timed asserts fail on slow CI machines)
    second = run_pipeline(load(REPO_ROOT / "pipelines" / "quickstart_tiny.yaml", [*SMALL, f"workdir={tmp_path / 'work'}"]))
    assert {o.state for o in second} == {"cached"}
    print_summary(second)
    shown = capsys.readouterr().out
    assert "win rate" in shown and "report (eval_ppo)" in shown


def test_quickstart_shapes_script_builds_a_random_model_and_a_valid_pipeline(tmp_path: Path) -> None:
    """scripts/quickstart_shapes.py (GPU cost runs without the real weights): the random model has the
    source's config and tokenizer and other weights; the written pipeline is quickstart.yaml without its
    import stage, the SFT starting from that model, and passes ``alignctl run --dry-run``; a workdir
    holding the user's own files is refused (exit 2) and left as it was."""
    import sys

    import torch
    import yaml
    from safetensors.torch import load_file

    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    import quickstart_shapes

    from alignctl.models.tiny import init_model

    texts = tmp_path / "texts.jsonl"
    texts.write_text("".join(json.dumps({"text": f"What is {a} + {b}? #### {a + b}"}) + "\n"
                             for a in range(20) for b in range(20)))
    source = tmp_path / "source"
    init_model(out=source, tokenizer_from=[texts], hidden=32, layers=2, vocab_size=300, seed=3)
    workdir = tmp_path / "shapes"
    assert quickstart_shapes.main(["--shapes-from", str(source), "--workdir", str(workdir), "--dry-run",
                                   "grpo.trainer.total_training_steps=2"]) == 0
    model = workdir / "random_model"
    assert json.loads((model / "config.json").read_text())["hidden_size"] == 32
    assert (model / "tokenizer.json").read_bytes() == (source / "tokenizer.json").read_bytes()
    ours, theirs = load_file(model / "model.safetensors"), load_file(source / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(ours[k].shape == theirs[k].shape for k in ours)
    assert any(not torch.equal(ours[k], theirs[k]) for k in ours if ours[k].dim() == 2)  # seed 0, not 3
    spec = yaml.safe_load((workdir / "quickstart_shapes.yaml").read_text())
    shipped = yaml.safe_load((REPO_ROOT / "pipelines" / "quickstart.yaml").read_text())
    assert set(spec["stages"]) == set(shipped["stages"]) - {"base_model"}
    assert spec["stages"]["sft"]["config"]["model"]["path"] == str(model)
    assert spec["stages"]["grpo"] == shipped["stages"]["grpo"]
    assert spec["workdir"] == str(workdir / "work")

    users = tmp_path / "users"
    users.mkdir()
    (users / "notes.txt").write_text("mine")
    assert quickstart_shapes.main(["--shapes-from", str(source), "--workdir", str(users), "--dry-run"]) == 2
    assert [p.name for p in users.iterdir()] == ["notes.txt"]
