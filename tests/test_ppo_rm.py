"""Four-model PPO on the arith task: actor + critic (GAE) + frozen reference (KL in reward) + a
reward model trained here by ``train-rm``, two FSDP2 workers. The policy's reward-model score must
rise over 20 steps (what PPO optimises), with every metric finite."""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from alignctl.config.core import load_config
from alignctl.config.train_rm import RewardModelConfig
from alignctl.trainers.rm_trainer import run_train_rm
from alignctl.trainers.rl_trainer import RLTrainer
from rl_helpers import all_finite, make_assets, read_metrics, rl_config

pytestmark = pytest.mark.slow


def test_ppo_with_critic_rm_reward_and_kl_raises_the_rm_score(tmp_path: Path):
    assets = make_assets(tmp_path / "assets")
    rm_dir = tmp_path / "rm"
    rm_cfg = load_config(RewardModelConfig, None, [
        f"model.path={assets['model']}", f"data.train_files=[{assets['data'] / 'pref_train.parquet'}]",
        f"output_dir={rm_dir}", "trainer.total_epochs=3", "trainer.micro_batch_size=16", "optim.lr=2e-3"])
    run_train_rm(rm_cfg, progress=False)

    cfg = rl_config(assets, tmp_path / "run", "algorithm.adv_estimator=gae", "trainer.n_gpus_per_node=2",
                    "actor_rollout_ref.actor.strategy=fsdp2", "critic.strategy=fsdp2",
                    "reward_model.enable=true", f"reward_model.model.path={rm_dir}", "reward_model.rule_weight=0",
                    "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.01",
                    "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                    "trainer.total_training_steps=20")
    RLTrainer(cfg).fit()
    rows = read_metrics(tmp_path / "run")
    assert [r["step"] for r in rows] == list(range(1, 21))
    for row in rows:
        assert all_finite(row), row
        assert row["critic/vf_loss"] > 0 and "critic/vf_explained_var" in row
        assert row["actor/reward_kl_penalty_coeff"] == 0.01
    rm_scores = [r["reward/rm_score/mean"] for r in rows]
    first, last = statistics.fmean(rm_scores[:5]), statistics.fmean(rm_scores[-5:])
    print(f"\nRM score of the policy, steps 1-5: {first:.3f} -> steps 16-20: {last:.3f}")
    assert last > first + 0.1, rm_scores
