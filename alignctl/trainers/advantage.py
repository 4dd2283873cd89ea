"""``compute_advantage``: the controller's pure step from rewards (and values) to advantages."""

from __future__ import annotations

from alignctl.algos import get_adv_estimator
from alignctl.batch import Batch
from alignctl.config.rl import AlgorithmConfig


def compute_advantage(batch: Batch, algorithm: AlgorithmConfig) -> Batch:
    """Advantages and returns [N, T] by the configured estimator; responses of one prompt share
    ``group_index`` (GRPO/RLOO/OPO groups), ReMax reads ``baseline_rewards``, GAE ``values``."""
    estimator = get_adv_estimator(algorithm.adv_estimator)
    advantages, returns = estimator(
        batch["token_level_rewards"], batch["response_mask"].float(),
        values=batch["values"] if "values" in batch else None,
        group_index=batch["group_index"],
        baseline_rewards=batch["baseline_rewards"] if "baseline_rewards" in batch else None,
        gamma=algorithm.gamma, lam=algorithm.lam, norm_adv_by_std=algorithm.norm_adv_by_std_in_grpo,
    )
    return Batch({"advantages": advantages, "returns": returns})
