"""alignctl.algos: the pure math of RL post-training.

torch and the standard library only: no config objects (callers unpack config into plain
arguments), no ``.item()`` (nothing forces a device sync), no ``torch.distributed`` (callers pass
global token / sequence counts instead). Importing this package loads neither ray, vllm,
deepspeed nor transformers. Formulas and config names: docs/algorithms.md.
"""

from __future__ import annotations

from alignctl.algos.advantages import GroupIndex, discounted_returns, group_ids
from alignctl.algos.aggregation import LOSS_AGG_MODES, agg_loss, count_loss_seqs, count_loss_tokens
from alignctl.algos.bradley_terry import bradley_terry_loss, preference_accuracy
from alignctl.algos.entropy import entropy_from_log_probs, entropy_from_logits
from alignctl.algos.kl import KL_PENALTY_KINDS, kl_penalized_rewards, kl_penalty
from alignctl.algos.kl_control import (
    KL_CTRL_TYPES,
    AdaptiveKLController,
    FixedKLController,
    make_kl_controller,
)
from alignctl.algos.masked import masked_count, masked_mean, masked_sum, masked_var, masked_whiten, safe_div
from alignctl.algos.policy_loss import POLICY_LOSSES, PolicyLoss, get_policy_loss, register_policy_loss
from alignctl.algos.rollout_correction import ROLLOUT_CORRECTION_MODES, rollout_correction_weights, rollout_mismatch
from alignctl.registries import Registry
from alignctl.algos.value import compute_value_loss

__all__ = [
    "AdaptiveKLController",
    "FixedKLController",
    "GroupIndex",
    "KL_CTRL_TYPES",
    "KL_PENALTY_KINDS",
    "LOSS_AGG_MODES",
    "POLICY_LOSSES",
    "PolicyLoss",
    "ROLLOUT_CORRECTION_MODES",
    "Registry",
    "agg_loss",
    "bradley_terry_loss",
    "compute_value_loss",
    "count_loss_seqs",
    "count_loss_tokens",
    "discounted_returns",
    "entropy_from_log_probs",
    "entropy_from_logits",
    "get_policy_loss",
    "group_ids",
    "kl_penalized_rewards",
    "kl_penalty",
    "make_kl_controller",
    "masked_count",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "preference_accuracy",
    "register_policy_loss",
    "rollout_correction_weights",
    "rollout_mismatch",
    "safe_div",
]
