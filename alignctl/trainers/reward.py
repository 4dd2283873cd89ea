"""The controller's reward step: decode responses, score them with the rule / custom reward
manager (and the reward model when enabled), place the score on the last response token.

Scoring runs in a background thread (``submit``) so it overlaps the workers' log-prob passes:
it is off the step's critical path unless it is slower than them.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import torch

from alignctl.batch import Batch
from alignctl.config.rl import RLConfig
from alignctl.models.loading import last_token_index
from alignctl.rewards.reward_function import load_reward_function
from alignctl.rewards.managers import REWARD_MANAGERS, RewardInputs, build_reward_manager
from alignctl.rewards.rule_scorers import answer_format_share


def manager_options(cfg: RLConfig, name: str) -> dict[str, Any]:
    """The options the reward manager ``name`` declares (``config_options``), read from the config."""

    def read(dotted: str) -> Any:
        value: Any = cfg
        for part in dotted.split("."):
            value = getattr(value, part)
        return value

    return {option: read(key) for option, key in REWARD_MANAGERS.get(name).config_options.items()}


class RewardComputer:
    def __init__(self, cfg: RLConfig, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        rm = cfg.reward_model
        custom = cfg.custom_reward_function
        fn = load_reward_function(custom.path, custom.name) if custom.path else None
        self.manager = build_reward_manager(rm.reward_manager, compute_score=fn, num_workers=rm.num_workers,
                                            timeout_s=rm.timeout_s,
                                            **manager_options(cfg, rm.reward_manager))
        self.model_scorer: Any = None  # set by the trainer when reward_model.enable: scores via the RM workers
        self.multi_turn = cfg.actor_rollout_ref.rollout.multi_turn
        self.rule_weight = rm.rule_weight if rm.enable else 1.0
        self.rm_weight = rm.rm_weight
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="alignctl-reward")

    def decode(self, batch: Batch) -> list[str]:
        """Each response's text: every real token (in a multi-turn response the tool messages too,
        as verl passes them), not only the sampled ones."""
        width = batch["responses"].shape[1]
        real = batch["attention_mask"][:, -width:].tolist()
        rows = [[t for t, keep in zip(ids, mask) if keep] for ids, mask in zip(batch["responses"].tolist(), real)]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def score(self, batch: Batch, *, use_model: bool = True) -> Batch:
        """Token-level scores; ``use_model=False`` gives rule/custom scores only (validation
        accuracy is about correctness, not the RM's opinion)."""
        texts = self.decode(batch)
        rules_off = use_model and self.model_scorer is not None and self.rule_weight == 0
        if rules_off:  # RM-only rewards (e.g. HH dialogue): no rule scorer exists for such data
            scores, metrics = torch.zeros(batch["responses"].shape, dtype=torch.float32), {}
        else:
            scores, metrics = self._rule_scores(batch, texts)
            # the gold signal the monitor compares the reward model's score with (reward hacking)
            metrics["reward/rule_score/mean"] = float(scores.sum(-1).mean())
            if (share := answer_format_share(batch["data_source"], texts)) is not None:
                metrics["reward/answer_format/mean"] = share
            scores = scores * (self.rule_weight if use_model else 1.0)
        if self.model_scorer is not None and use_model:
            texts_batch = Batch(lists={"raw_prompt": batch["raw_prompt"], "response_text": texts})
            rm_scores = self.model_scorer(texts_batch)["rm_scores"]  # [N] one score per response
            last = last_token_index(batch["response_mask"])  # the last sampled token
            scores[torch.arange(len(batch)), last] += self.rm_weight * rm_scores.float()
            metrics["reward/rm_score/mean"] = float(rm_scores.float().mean())
        if use_model and "tool_valid_calls" in batch:
            self._add_tool_terms(batch, scores, metrics)
        return Batch({"token_level_scores": scores}, meta={"reward_metrics": metrics})

    def _add_tool_terms(self, batch: Batch, scores: torch.Tensor, metrics: dict[str, float]) -> None:
        """Per-trajectory terms of a multi-turn rollout: a reward per tool call that ran, a penalty
        per failed one, on the last sampled token (not in validation: accuracy is the answer's)."""
        mt = self.multi_turn
        valid = torch.tensor(batch["tool_valid_calls"], dtype=torch.float32)
        errors = torch.tensor(batch["tool_errors"], dtype=torch.float32)
        terms = mt.valid_call_reward * valid - mt.tool_error_penalty * errors
        scores[torch.arange(len(batch)), last_token_index(batch["response_mask"])] += terms
        metrics["reward/tool_terms/mean"] = float(terms.mean())

    def _rule_scores(self, batch: Batch, texts: list[str]) -> tuple[torch.Tensor, dict[str, float]]:
        out = self.manager(RewardInputs(
            data_sources=batch["data_source"], responses=texts, ground_truths=batch["ground_truth"],
            response_width=batch["responses"].shape[1], extra_infos=batch["extra_info"],
            response_mask=batch["response_mask"]))
        metrics = {"reward/num_timeouts": float(out.num_timeouts), "reward/num_crashes": float(out.num_crashes)}
        for key, values in out.extra.items():
            numeric = [float(v) for v in values if isinstance(v, (int, float))]
            if numeric:
                metrics[f"reward/extra/{key}/mean"] = sum(numeric) / len(numeric)
        return out.token_level_scores.float(), metrics

    def submit(self, batch: Batch) -> Future[Batch]:
        return self.pool.submit(self.score, batch)

    def close(self) -> None:
        self.pool.shutdown(wait=False)
        self.manager.close()
