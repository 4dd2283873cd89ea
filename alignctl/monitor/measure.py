"""Measuring the baseline: the reference policy samples ``monitor.baseline_prompts`` training
prompts (``rollout.n`` responses each, the training sampling settings) before step 1; the
responses are scored as training scores them, and one log-prob pass gives their entropy.

Plumbing over the RL trainer (its ``generate``, reward computer and workers), like
trainers/validation.py; the numbers are made by the pure :func:`baseline.summarize`.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from typing import Any

from alignctl.batch import Batch
from alignctl.data.rl_dataset import to_batch
from alignctl.monitor.alarms import gold_and_proxy
from alignctl.monitor.baseline import Baseline, summarize
from alignctl.monitor.signals import response_diversity



def baseline_prompts(dataset: Any, count: int, world_size: int, seed: int) -> Batch:
    """``count`` training prompts (rounded up to a multiple of the workers), drawn with the run's seed."""
    count = min(-(-count // world_size) * world_size, len(dataset) - len(dataset) % world_size)
    picked = sorted(random.Random(seed).sample(range(len(dataset)), count))
    return to_batch([dataset[i] for i in picked], picked)


def measure_baseline(trainer: Any, prompts: Batch, logp_inputs: tuple[str, ...]) -> Baseline:
    cfg = trainer.cfg
    rollout = cfg.actor_rollout_ref.rollout
    start = time.perf_counter()
    batch = trainer.generate(prompts, n=rollout.n, do_sample=rollout.do_sample, temperature=rollout.temperature,
                             top_p=rollout.top_p, top_k=rollout.top_k)
    scored = trainer.parts.reward.score(batch)
    metrics = scored.meta.get("reward_metrics", {})
    gold_key, proxy_key = gold_and_proxy(metrics)
    group_index = batch["group_index"].tolist()
    gold_by_group = None
    if gold_key is not None:  # one gold mean per prompt group: its spread is the test's noise
        rows: dict[int, list[int]] = defaultdict(list)
        for row, gid in enumerate(group_index):
            rows[gid].append(row)
        gold_by_group = {gid: trainer.parts.reward.score(batch.index(members), use_model=False)
                         .meta["reward_metrics"][gold_key] for gid, members in rows.items()}
    entropys = trainer.workers.split("actor", "compute_log_prob", batch.select(logp_inputs))["entropys"]
    mask = batch["response_mask"].float()
    entropy = float((entropys.float() * mask).sum() / mask.sum().clamp(min=1))
    scores = scored["token_level_scores"].sum(-1).tolist()
    unique = response_diversity(batch["responses"], batch["response_mask"], None).get("monitor/unique_in_batch")
    return summarize(group_index, mask.sum(-1).tolist(), scores, proxy_key=proxy_key,
                     proxy=metrics.get(proxy_key) if proxy_key != "critic/score/mean" else None,
                     gold_key=gold_key, gold_by_group=gold_by_group, entropy=entropy, unique=unique,
                     informative_only=cfg.algorithm.filter_groups.enable, seconds=time.perf_counter() - start)
