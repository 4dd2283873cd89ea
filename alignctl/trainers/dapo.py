"""DAPO's dynamic sampling (Yu et al., 2025) as a customisation of the one RL loop.

A group whose responses all got the same score has zero advantage for every estimator that
compares within the group, so it only dilutes the batch. ``DAPOTrainer`` overrides the single
``collect_batch`` hook: it scores each generation round right away, keeps the groups whose scores
differ, and draws more prompts until ``data.train_batch_size`` groups are kept. Everything else
(log-probs, advantages, updates) is the parent loop unchanged. Clip-higher
(``clip_ratio_high``) and the overlong penalty (``reward_model.reward_manager=dapo``) are plain
config; see pipelines/arith_dapo.yaml.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch

from alignctl.batch import Batch
from alignctl.errors import UserError
from alignctl.trainers.metrics import Timer
from alignctl.trainers.rl_trainer import RLTrainer


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


class DAPOTrainer(RLTrainer):
    def collect_batch(self, prompts: Batch, timer: Timer) -> tuple[Batch, Future[Batch]]:
        want = self.cfg.data.train_batch_size
        rollout = self.cfg.actor_rollout_ref.rollout
        parts: list[Batch] = []
        kept = 0
        rounds = 0
        while kept < want:
            if rounds:
                prompts = self.parts.loader.next_batch()  # top up with fresh prompts
            if rounds == self.cfg.algorithm.filter_groups.max_num_gen_batches:
                raise UserError(f"DAPO dynamic sampling kept {kept} of {want} prompt groups after {rounds} rounds "
                                f"(algorithm.filter_groups.max_num_gen_batches): almost every group gets equal "
                                f"scores; raise that key or check the reward function")
            # Rounds are concatenated, so every round uses the same (maximal) prompt width.
            batch = self.generate(prompts, n=rollout.n, do_sample=rollout.do_sample, temperature=rollout.temperature,
                                  top_p=rollout.top_p, top_k=rollout.top_k, prompt_width=self.cfg.data.max_prompt_length)
            batch = batch.union(self.parts.reward.score(batch))
            groups = informative_groups(batch["group_index"], batch["token_level_scores"].sum(-1))[: want - kept]
            rows = [i for i, gid in enumerate(batch["group_index"].tolist()) if gid in set(groups)]
            parts.append(batch.index(rows))
            kept += len(groups)
            rounds += 1
        full = Batch.concat(parts)
        full.meta["reward_metrics"] = {**full.meta.get("reward_metrics", {}), "dapo/num_gen_batches": float(rounds)}
        scores = Batch({"token_level_scores": full.tensors.pop("token_level_scores")}, meta=dict(full.meta))
        done: Future[Batch] = Future()
        done.set_result(scores)
        return full, done
