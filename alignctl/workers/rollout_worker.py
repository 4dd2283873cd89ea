"""Role ``rollout``: generation on a resource pool of its own (``trainer.placement.rollout``).

The worker holds only a rollout engine (vllm, or hf with its own copy of the policy) and no
trainer. After every actor update the controller hands it the actor's complete weights through
Ray's object store (shared memory on one node; Ray's transfer between nodes) together with the
trainer's log-probs of a probe sequence; the worker loads the weights, checks its engine's
log-probs against the trainer's, and records the policy version it now generates with. Every batch
it returns carries that version in ``meta["policy_version"]``.
"""

from __future__ import annotations

from typing import Any

import torch

from alignctl.batch import Batch
from alignctl.config.core import build_config
from alignctl.config.rl import RLConfig
from alignctl.models.loading import load_causal_lm, load_tokenizer
from alignctl.rollout import RolloutSetup, build_rollout_engine, engine_entry
from alignctl.workers.generation import generate_batch, with_tools
from alignctl.workers.model_setup import eos_ids
from alignctl.workers.rollout_sync import RolloutSyncCheck
from alignctl.workers.worker_process import DistContext


class RolloutWorker:
    """``generate_sequences`` and ``load_weights``."""

    def __init__(self, ctx: DistContext, config: dict[str, Any]) -> None:
        self.ctx = ctx
        self.cfg: RLConfig = build_config(RLConfig, config)
        arr = self.cfg.actor_rollout_ref
        torch.manual_seed(self.cfg.trainer.seed)
        path = str(arr.model.path)
        self.tokenizer = load_tokenizer(arr.model.tokenizer_path or path, padding_side="left")
        entry = engine_entry(arr.rollout.name)
        # An engine that runs a torch module (hf) gets one of its own, loaded like the actor's.
        model = load_causal_lm(path, dtype=arr.model.dtype).eval() if entry.capabilities.trainer_precision else None
        if model is not None and ctx.device == "cuda":
            model = model.cuda()
        self.pad_id = int(self.tokenizer.pad_token_id)
        stop_ids = eos_ids(self.tokenizer, model) if model is not None else [int(self.tokenizer.eos_token_id)]
        setup = RolloutSetup(model=model, model_path=path, pad_token_id=self.pad_id, eos_token_ids=stop_ids,
                             dtype=arr.model.dtype, max_model_len=self.cfg.data.max_prompt_length
                             + self.cfg.data.max_response_length, seed=self.cfg.trainer.seed, own_copy=True)
        self.rollout = with_tools(build_rollout_engine(arr.rollout, setup), self.cfg, self.tokenizer, stop_ids)
        self.precision = self.cfg.trainer.precision if entry.capabilities.trainer_precision else "fp32"
        self.sync_check = RolloutSyncCheck(arr.rollout.verify_sync, arr.rollout.sync_check_tol)
        self.policy_version = -1  # no weights from the actor yet

    def load_weights(self, payload: dict[str, Any], version: int) -> None:
        """The actor's weights after ``version`` updates (payload of ActorRolloutRefWorker.export_rollout_weights)."""
        self.rollout.wake()
        self.rollout.sync_weights(payload["weights"])
        self.sync_check.compare(self.rollout, payload["probe"], payload["probe_log_probs"], step=version + 1)
        self.policy_version = version

    def generate_sequences(self, prompts: Batch) -> Batch:
        out = generate_batch(
            self.rollout, prompts, max_new_tokens=self.cfg.data.max_response_length, rank=self.ctx.rank,
            device=self.ctx.device, precision=self.precision, pad_id=self.pad_id,
            free_cache=self.cfg.actor_rollout_ref.rollout.free_cache_engine,
            extra_metrics=lambda: self.sync_check.metrics)
        out.meta["policy_version"] = self.policy_version
        return out
