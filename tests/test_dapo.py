"""DAPO dynamic sampling: the pure group filter, and the subclassed loop end to end."""

from __future__ import annotations

import pytest
import torch

from alignctl.trainers.dapo import DAPOTrainer, informative_groups, pool_round_metrics
from alignctl.trainers.rl_factory import create_trainer
from alignctl.workers.ray_session import init_ray
from rl_helpers import all_finite, make_assets, read_metrics, rl_config

# Binary reward: many groups of 2 get equal scores, so filtering has work to do.
HAS_ONE = '''
def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 1.0 if "1" in solution_str else 0.0
'''


def test_informative_groups_keeps_groups_with_different_scores():
    group = torch.tensor([7, 7, 3, 3, 5, 5, 9])
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 2.0])
    # 7: equal -> drop; 3: differ -> keep; 5: equal -> drop; 9: singleton (all equal) -> drop
    assert informative_groups(group, scores) == [3]
    assert informative_groups(torch.tensor([1, 2, 1, 2]), torch.tensor([0.0, 1.0, 1.0, 1.0])) == [1]


def test_round_metrics_pool_means_by_responses_and_add_counts():
    # by hand: 8 responses at 0.25 right and 24 at 0.75 -> (2 + 18) / 32 = 0.625; timeouts 1 + 2 = 3
    rounds = [(8, {"reward/rule_score/mean": 0.25, "reward/num_timeouts": 1.0}),
              (24, {"reward/rule_score/mean": 0.75, "reward/num_timeouts": 2.0})]
    assert pool_round_metrics(rounds) == {"reward/rule_score/mean": 0.625, "reward/num_timeouts": 3.0}
    assert pool_round_metrics([(4, {"reward/answer_format/mean": 0.5})]) == {"reward/answer_format/mean": 0.5}


@pytest.mark.slow
def test_dapo_trains_only_on_informative_groups(tmp_path):
    import ray

    assets = make_assets(tmp_path / "assets")
    (tmp_path / "has_one.py").write_text(HAS_ONE)
    cfg = rl_config(assets, tmp_path / "run", f"custom_reward_function.path={tmp_path / 'has_one.py'}",
                    "algorithm.filter_groups.enable=true", "algorithm.filter_groups.max_num_gen_batches=20",
                    "actor_rollout_ref.rollout.n=2", "data.max_response_length=8", "trainer.total_training_steps=2")
    trainer = create_trainer(cfg)
    assert isinstance(trainer, DAPOTrainer)
    init_ray(None, num_cpus=2)
    try:
        trainer.fit()
    finally:
        ray.shutdown()
    batch = trainer.last_batch
    scores = batch["token_level_scores"].sum(-1)
    assert len(batch) == cfg.data.train_batch_size * 2
    assert len(informative_groups(batch["group_index"], scores)) == cfg.data.train_batch_size
    rows = read_metrics(tmp_path / "run")
    assert all(all_finite(r) for r in rows)
    assert all(r["dapo/num_gen_batches"] >= 1 for r in rows)
    # each round draws train_batch_size prompts and the kept ones fill one round's worth, so the
    # informative share over every round's groups is at least 1 / rounds
    assert all(1 / r["dapo/num_gen_batches"] <= r["dapo/informative_share"] <= 1 for r in rows)
