"""The reward-model role: scores (prompt, response) with a sequence-classification RM.

The RM re-tokenizes each conversation with its OWN tokenizer and chat template (it may differ from
the policy's), reads the score at the last token, and normalises with the mean/std train-rm saved.
The controller sends decoded text, never token ids, for that reason. Scoring is plain inference
(no collectives), so it may interleave freely with other roles' calls in the same process.
``reward_model.model.fsdp_config.param_offload`` keeps the weights in CPU memory between scoring
passes (:class:`~alignctl.workers.offload.ParkedModule`).
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch

from alignctl.batch import Batch
from alignctl.config.core import build_config
from alignctl.config.rl import RLConfig
from alignctl.eval.scoring import RewardScorer
from alignctl.workers.worker_process import DistContext
from alignctl.workers.offload import ParkedModule


class RewardModelWorker:
    """Role ``rm``: ``compute_rm_score``."""

    def __init__(self, ctx: DistContext, config: dict[str, Any]) -> None:
        cfg: RLConfig = build_config(RLConfig, config)
        rm = cfg.reward_model
        self.scorer = RewardScorer(rm.model.path, device=ctx.device, dtype=cfg.actor_rollout_ref.model.dtype,
                                   batch_size=rm.micro_batch_size_per_gpu or 64, max_length=None,
                                   normalize=rm.normalize, progress=False, precision=cfg.trainer.precision)
        self.parking = ParkedModule(self.scorer.model, ctx.device) if rm.model.fsdp_config.param_offload else None

    def compute_rm_score(self, batch: Batch) -> Batch:
        reply = [[{"role": "assistant", "content": text}] for text in batch["response_text"]]
        parked = self.parking.on_device() if self.parking is not None else contextlib.nullcontext()
        with parked:
            scores = self.scorer.score(list(zip(batch["raw_prompt"], reply)), "reward model")
        return Batch({"rm_scores": torch.as_tensor(scores, dtype=torch.float32)})
