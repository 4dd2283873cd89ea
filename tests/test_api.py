"""The Python API of the product card runs the real trainer (tiny model, CPU, Ray workers)."""

from __future__ import annotations

import subprocess
import sys

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
    assert result.steps == 2 and len(calls) == 8  # the Python callable scored every response
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == [1, 2] and "critic/vf_loss" in rows[0]
    saved = trainer.save_model(tmp_path / "policy")
    assert AutoModelForCausalLM.from_pretrained(saved).config.vocab_size > 0
