"""Extra rollouts an estimator can ask the loop for (``register_adv_estimator(extra_rollouts=...)``).

An entry is ``fn(loop, prompts, batch) -> Batch``: given the step's prompts and its sampled batch,
it generates (and scores) whatever else the estimator needs and returns columns, one row per
response of ``batch``, that the loop unions into the batch before the advantages are computed.
``loop`` is the running trainer (``RLTrainer``): ``loop.generate(...)`` samples with the step's
seed, ``loop.parts.reward.score(batch)`` gives token-level scores.

Built in: ``greedy_baseline`` (ReMax): each prompt's greedy response is scored and its reward
becomes ``baseline_rewards`` [B] of the prompt's samples.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from alignctl.registries import Registry
from alignctl.batch import Batch

__all__ = ["EXTRA_ROLLOUTS", "ExtraRollout", "register_extra_rollout"]

ExtraRollout = Callable[[Any, Batch, Batch], Batch]

EXTRA_ROLLOUTS: Registry[ExtraRollout] = Registry("extra rollout")


def register_extra_rollout(name: str) -> Callable[[ExtraRollout], ExtraRollout]:
    """Decorator registering ``fn(loop, prompts, batch) -> Batch`` as the extra rollout ``name``."""
    return EXTRA_ROLLOUTS.register(name)


@register_extra_rollout("greedy_baseline")
def greedy_baseline(loop: Any, prompts: Batch, batch: Batch) -> Batch:
    """``baseline_rewards`` [B]: the reward of each prompt's greedy response, for its samples."""
    greedy = loop.generate(prompts.select(prompts.keys()), n=1, do_sample=False, temperature=1.0, top_p=1.0, top_k=-1)
    scores = loop.parts.reward.score(greedy)["token_level_scores"].sum(-1)
    by_uid = dict(zip(greedy["group_index"].tolist(), scores.tolist()))
    return Batch({"baseline_rewards": torch.tensor([by_uid[int(u)] for u in batch["group_index"]])})
