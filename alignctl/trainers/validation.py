"""Validation: generate on held-out prompts (greedy by default) and score per data source.

Metric names follow verl: ``val-core/<data_source>/acc/mean@N`` (mean score over all N samples of
every prompt), and with N > 1 also ``best@N`` (mean over prompts of the best sample's score) and
``maj@N`` (score of the majority-voted answer, for sources with a default rule scorer; answers vote
by that scorer's equivalence, :func:`alignctl.rewards.rule_scorers.default_vote_keys`, as in eval).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from alignctl.data.rl_dataset import to_batch
from alignctl.errors import UserError
from alignctl.eval.stats import majority_index
from alignctl.rewards.rule_scorers import default_vote_keys


def _padded(rows: list[dict[str, Any]], multiple: int) -> list[dict[str, Any]]:
    """Repeat the last prompt so every worker gets the same number (extra results are dropped)."""
    missing = -len(rows) % multiple
    return rows + [rows[-1]] * missing


def aggregate(records: list[dict[str, Any]], n: int) -> dict[str, float]:
    """records: one per response with data_source, uid, score, response. Pure, unit-tested."""
    by_source: dict[str, dict[int, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rec in records:
        by_source[rec["data_source"]][rec["uid"]].append(rec)
    metrics: dict[str, float] = {}
    for source, groups in sorted(by_source.items()):
        scores = [r["score"] for g in groups.values() for r in g]
        metrics[f"val-core/{source}/acc/mean@{n}"] = sum(scores) / len(scores)
        if n > 1:
            best = [max(r["score"] for r in g) for g in groups.values()]
            metrics[f"val-core/{source}/acc/best@{n}"] = sum(best) / len(best)
            majority = [_majority_score(source, g) for g in groups.values()]
            if all(m is not None for m in majority):
                metrics[f"val-core/{source}/acc/maj@{n}"] = sum(majority) / len(majority)
    return metrics


def _majority_score(source: str, group: list[dict[str, Any]]) -> float | None:
    """Score of the majority-voted response; None when the source has no default rule scorer."""
    try:
        keys = default_vote_keys(source, [r["response"] for r in group])
    except UserError:
        return None  # no scorer, so no notion of equal answers
    j = majority_index(keys)
    return 0.0 if j is None else group[j]["score"]


def validate(trainer: Any, dataset: Any) -> dict[str, float]:
    cfg = trainer.cfg
    val = cfg.actor_rollout_ref.rollout.val_kwargs
    world = trainer.workers.world_size
    rows = [dataset[i] for i in range(len(dataset))]
    size = cfg.data.val_batch_size or len(rows)
    records: list[dict[str, Any]] = []
    for start in range(0, len(rows), size):
        chunk = rows[start:start + size]
        prompts = to_batch(_padded(chunk, world), list(range(start, start + len(_padded(chunk, world)))))
        batch = trainer.generate(prompts, n=val.n, do_sample=val.do_sample, temperature=val.temperature,
                                 top_p=val.top_p, top_k=val.top_k)
        keep = [i for i, uid in enumerate(batch["group_index"].tolist()) if uid < start + len(chunk)]
        batch = batch.index(keep)
        scored = trainer.parts.reward.score(batch, use_model=False)
        scores = scored["token_level_scores"].sum(-1).tolist()
        texts = trainer.parts.reward.decode(batch)
        for i, uid in enumerate(batch["group_index"].tolist()):
            records.append({"data_source": batch["data_source"][i], "uid": uid, "score": scores[i], "response": texts[i]})
    return aggregate(records, val.n)
