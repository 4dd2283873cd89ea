"""DAPO's dynamic sampling (Yu et al., 2025) as a customisation of the one RL loop.

A group whose responses all got the same score has zero advantage for every estimator that
compares within the group, so it only dilutes the batch. ``DAPOTrainer`` overrides the single
``collect_batch`` hook: it scores each generation round right away, keeps the groups whose scores
differ, and draws more prompts until ``data.train_batch_size`` groups are kept. Everything else
(log-probs, advantages, updates) is the parent loop unchanged. The step's ``reward/*`` metrics pool
every round (what the policy samples, not the filtered batch) and ``dapo/informative_share`` says
which share of the drawn groups carried a learning signal. Clip-higher
(``clip_ratio_high``) and the overlong penalty (``reward_model.reward_manager=dapo``) are plain
config; see pipelines/arith_dapo.yaml.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import torch

from alignctl.batch import Batch
from alignctl.errors import UserError
from alignctl.trainers.metrics import Timer
from alignctl.trainers.rl_trainer import RLTrainer

# Reward metrics that are counts add up over rounds; every other one is a mean over the round's responses.
_COUNT_METRICS = ("reward/num_timeouts", "reward/num_crashes")


def informative_groups(group_index: torch.Tensor, scores: torch.Tensor) -> list[int]:
    """Group ids (in first-seen order) whose scores are not all equal."""
    kept, seen = [], set()
    for gid in group_index.tolist():
        if gid in seen:
            continue
        seen.add(gid)
        member = scores[group_index == gid]
        if bool((member != member[0]).any()):
            kept.append(gid)
    return kept


def pool_round_metrics(rounds: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """One step's reward metrics from every generation round, ``(responses, metrics)`` each: means
    weighted by the round's responses, counts summed. The kept batch is biased towards groups that
    are half right, so only the pooled rounds show what the policy samples (the accuracy curve)."""
    total = sum(size for size, _ in rounds)
    pooled: dict[str, float] = {}
    for size, metrics in rounds:
        for key, value in metrics.items():
            share = 1.0 if key in _COUNT_METRICS else size / total
            pooled[key] = pooled.get(key, 0.0) + share * float(value)
    return pooled


class DAPOTrainer(RLTrainer):
    def rollout_request(self) -> dict[str, Any]:
        # Rounds are concatenated, so every round uses the same (maximal) prompt width.
        return {**super().rollout_request(), "prompt_width": self.cfg.data.max_prompt_length}

    def collect_batch(self, prompts: Batch, timer: Timer) -> tuple[Batch, Future[Batch]]:
        want = self.cfg.data.train_batch_size
        parts: list[Batch] = []
        kept = 0
        rounds = 0
        round_metrics: list[tuple[int, dict[str, float]]] = []
        informative = generated = 0
        while kept < want:
            if rounds:
                prompts = self.next_prompts()  # top up with fresh prompts (queued ahead with async rollouts)
            if rounds == self.cfg.algorithm.filter_groups.max_num_gen_batches:
                raise UserError(f"DAPO dynamic sampling kept {kept} of {want} prompt groups after {rounds} rounds "
                                f"(algorithm.filter_groups.max_num_gen_batches): almost every group gets equal "
                                f"scores; raise that key or check the reward function")
            batch = self.generate(prompts, **self.rollout_request())
            batch = batch.union(self.parts.reward.score(batch))
            round_metrics.append((len(batch), batch.meta.get("reward_metrics", {})))
            ids = batch["group_index"].tolist()
            groups = informative_groups(batch["group_index"], batch["token_level_scores"].sum(-1))
            informative, generated = informative + len(groups), generated + len(set(ids))
            keep = set(groups[: want - kept])
            parts.append(batch.index([i for i, gid in enumerate(ids) if gid in keep]))
            kept += len(keep)
            rounds += 1
        full = Batch.concat(parts)
        full.meta["reward_metrics"] = {**pool_round_metrics(round_metrics), "dapo/num_gen_batches": float(rounds),
                                       "dapo/informative_share": informative / generated}
        scores = Batch({"token_level_scores": full.tensors.pop("token_level_scores")}, meta=dict(full.meta))
        done: Future[Batch] = Future()
        done.set_result(scores)
        return full, done
