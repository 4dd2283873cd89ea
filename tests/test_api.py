"""The Python API of the product card runs the real trainer (tiny model, CPU, Ray workers)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from alignctl.errors import UserError
from rl_helpers import make_assets, read_metrics


def test_import_alignctl_is_light():
    code = ("import sys, alignctl; heavy = [m for m in ('torch', 'ray', 'transformers', 'trl') if m in sys.modules];"
            "print(','.join(heavy))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == ""


def test_ppo_config_maps_onto_rl_keys():
    from alignctl import PPOConfig

    keys = PPOConfig(actor_model="a", reward_model="rm", kl_coeff=0.1, clip_range=0.3, learning_rate=2e-5,
                     batch_size=8, mini_batch_size=4, ppo_epochs=2).overrides()
    assert keys["actor_rollout_ref.actor.clip_ratio"] == 0.3 and keys["algorithm.kl_ctrl.kl_coef"] == 0.1
    assert keys["actor_rollout_ref.actor.ppo_mini_batch_size"] == 4 and keys["actor_rollout_ref.actor.ppo_epochs"] == 2
    assert keys["reward_model.enable"] is True and keys["critic.model.path"] == "a"
    with pytest.raises(UserError, match="reference policy is the initial actor"):
        PPOConfig(actor_model="a", ref_model="b").overrides()


@pytest.mark.slow
def test_rlhf_trainer_trains_and_saves(tmp_path):
    import ray
    from transformers import AutoModelForCausalLM

    from alignctl import PPOConfig, RLHFTrainer

    assets = make_assets(tmp_path / "assets")
    calls = []

    def digits(data_source, solution_str, ground_truth, extra_info=None):
        calls.append(solution_str)
        return sum(c.isdigit() for c in solution_str) / max(1, len(solution_str))

    config = PPOConfig(actor_model=str(assets["model"]), kl_coeff=0.01, learning_rate=1e-3, batch_size=4,
                       mini_batch_size=2, max_prompt_length=128, max_response_length=16,
                       output_dir=str(tmp_path / "run"), extra={"trainer.logger": ["jsonl"]})
    frame = pd.read_parquet(assets["data"] / "train.parquet")
    trainer = RLHFTrainer(config=config, train_dataset=frame, num_gpus=0, reward_fn=digits)
    try:
        result = trainer.train(num_episodes=8)  # 2 steps of 4 prompts
    finally:
        ray.shutdown()
    from alignctl.config.rl import MonitorConfig

    # the Python callable scored every response: 2 steps x 4, and the monitor's baseline before step 1
    # (baseline_prompts prompts, one response each at rollout.n=1)
    assert result.steps == 2 and len(calls) == 8 + MonitorConfig().baseline_prompts
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and "critic/vf_loss" in rows[0]
    saved = trainer.save_model(tmp_path / "policy")
    assert AutoModelForCausalLM.from_pretrained(saved).config.vocab_size > 0


def _documented_blocks() -> list[str]:
    """The ```python api-example blocks of docs/api.md, in order."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "api.md").read_text(encoding="utf-8")
    blocks = [part.split("```", 1)[0] for part in text.split("```python api-example\n")[1:]]
    assert len(blocks) == 3
    return blocks


@pytest.mark.slow
def test_the_documented_api_blocks_run(tmp_path, monkeypatch, capsys):
    """docs/api.md's three blocks (reward model, PPO, evaluate) run as written, with the tiny model
    in place of SmolLM2 and in-memory datasets in the forms users pass: a list of preference dicts,
    a list of prompt strings, a list of chat-message prompts. Four CPU workers stand in for
    num_gpus=4 (no CUDA here)."""
    import ray

    assets = make_assets(tmp_path / "assets")
    pairs = pd.read_parquet(assets["data"] / "pref_train.parquet").to_dict("records")
    questions = [row["prompt"][-1]["content"] for row in pd.read_parquet(assets["data"] / "train.parquet").to_dict("records")]
    namespace = {"preference_dataset": pairs, "prompts": questions[:32],
                 "eval_prompts": [[{"role": "user", "content": q}] for q in questions[32:40]]}
    monkeypatch.chdir(tmp_path)
    try:
        for block in _documented_blocks():
            exec(compile(block.replace("HuggingFaceTB/SmolLM2-135M-Instruct", str(assets["model"])), "docs/api.md",
                         "exec"), namespace)
    finally:
        ray.shutdown()
    out = capsys.readouterr().out
    assert 0.0 <= namespace["rm_result"].metrics["val/accuracy"] <= 1.0
    assert namespace["result"].steps == 2  # 32 episodes / batch_size 16
    assert "num_gpus=4 but no CUDA device" in out
    results = namespace["results"]
    assert results.num_prompts == 8 and results.wins + results.ties + results.losses == 8
    assert results.config["reference"] == str(assets["model"].absolute())  # from the policy's manifest
    assert f"Win rate vs. the starting model: {results.win_rate:.2%}" in out
    assert "EvalResults: 8 prompts x 1" in out and "win_rate" in out


def test_evaluate_without_a_reference_or_a_recorded_start_is_one_line(tmp_path):
    from alignctl import evaluate

    assets = make_assets(tmp_path / "assets")
    with pytest.raises(UserError, match=r"records no starting model .* pass reference="):
        evaluate(model=assets["model"], prompts=["1 + 1?"], reward_model=assets["model"])


def test_every_in_memory_dataset_form_becomes_the_same_rows(tmp_path):
    """RL prompts and preference pairs in each form users pass give the same table."""
    import datasets

    from alignctl.api import _dataset_files
    from alignctl.trainers.sft_common import as_dataset

    pairs = [{"prompt": "2+2?", "chosen": "4", "rejected": "5"}, {"prompt": "1+1?", "chosen": "2", "rejected": "3"}]
    frame = pd.DataFrame(pairs)
    frame.to_parquet(tmp_path / "pairs.parquet")
    forms = [pairs, frame, datasets.Dataset.from_list(pairs), str(tmp_path / "pairs.parquet")]
    assert all(as_dataset(form, "preference_dataset").to_list() == pairs for form in forms)
    with pytest.raises(UserError, match="preference_dataset: expected a parquet path.*got int"):
        as_dataset(3, "preference_dataset")

    strings = _dataset_files(["2+2?", "1+1?"], tmp_path / "a")
    messages = _dataset_files([[{"role": "user", "content": "2+2?"}], [{"role": "user", "content": "1+1?"}]],
                              tmp_path / "b")
    rows = [pd.read_parquet(f[0]).to_dict("records") for f in (strings, messages)]
    assert rows[0] == rows[1] and [r["prompt"][0]["content"] for r in rows[0]] == ["2+2?", "1+1?"]
    assert rows[0][0]["data_source"] == "python"
    with pytest.raises(UserError, match=r"train_dataset\[1\]: expected a prompt string"):
        _dataset_files(["ok", 5], tmp_path / "c")


# ---------------------------------------------------------------------------------------------- save_model


def _trained(tmp_path, weights: bytes = b"step-2"):
    """An RLHFTrainer whose run is over (a fake run folder stands in for train())."""
    from types import SimpleNamespace

    from alignctl import PPOConfig, RLHFTrainer
    from alignctl.pipeline.ownership import mark_owned

    run = tmp_path / "run"
    (run / "actor").mkdir(parents=True)
    mark_owned(run, "rl-run")
    (run / "metrics.jsonl").write_text("{}\n")
    (run / "actor" / "config.json").write_text('{"model_type": "llama"}\n')
    (run / "actor" / "model.safetensors").write_bytes(weights)
    trainer = RLHFTrainer(config=PPOConfig(actor_model="unused"), train_dataset=["2 + 2?"])
    trainer.result = SimpleNamespace(run_dir=run, policy_dir=run / "actor")
    return trainer


def _tree(folder) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _leftovers(folder) -> list[str]:
    return sorted(p.name for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}."))


def test_save_model_refuses_a_folder_alignctl_did_not_write(tmp_path):
    trainer = _trained(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    with pytest.raises(UserError) as exc:
        trainer.save_model(mine)
    assert "\n" not in str(exc.value) and "not written by alignctl" in str(exc.value)
    assert _tree(mine) == {"notes.txt": b"keep me"} and _leftovers(mine) == []


def test_save_model_twice_replaces_its_own_output(tmp_path):
    from alignctl.pipeline.ownership import is_owned

    trainer = _trained(tmp_path)
    dest = tmp_path / "policy"
    assert trainer.save_model(dest) == dest
    assert is_owned(dest) and (dest / "model.safetensors").read_bytes() == b"step-2"
    (dest / "stale.txt").write_text("from the first save")
    (tmp_path / "run" / "actor" / "model.safetensors").write_bytes(b"step-4")
    trainer.save_model(dest)
    assert (dest / "model.safetensors").read_bytes() == b"step-4"
    assert not (dest / "stale.txt").exists()  # replaced, not merged
    assert _leftovers(dest) == []


def test_interrupted_save_model_leaves_the_previous_folder(tmp_path, monkeypatch):
    import shutil

    trainer = _trained(tmp_path)
    dest = tmp_path / "policy"
    trainer.save_model(dest)
    before = _tree(dest)
    (tmp_path / "run" / "actor" / "model.safetensors").write_bytes(b"step-4")

    def copy_half_then_die(src, dst, **kwargs):
        shutil.copy2(Path(src) / "config.json", Path(dst) / "config.json")
        raise KeyboardInterrupt  # a kill mid-copy

    monkeypatch.setattr(shutil, "copytree", copy_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        trainer.save_model(dest)
    assert _tree(dest) == before and _leftovers(dest) == []


def test_save_model_never_replaces_the_run_it_copies_from(tmp_path):
    trainer = _trained(tmp_path)
    run = tmp_path / "run"
    before = _tree(run)
    for target in (run, run / "actor"):
        with pytest.raises(UserError, match="holds the input"):
            trainer.save_model(target)
    assert _tree(run) == before and _leftovers(run) == []


def test_the_trainers_scratch_prompts_go_with_it():
    """The parquet the API writes for its workers lives in a folder of its own, removed when the
    trainer is collected (it used to stay in the temp dir forever, one per trainer)."""
    import gc

    from alignctl import PPOConfig, RLHFTrainer

    trainer = RLHFTrainer(config=PPOConfig(actor_model="unused"), train_dataset=["2 + 2?"])
    scratch = trainer.scratch
    assert (scratch / "train.parquet").is_file()
    del trainer
    gc.collect()
    assert not scratch.exists()
