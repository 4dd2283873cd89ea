"""The hybrid actor / rollout / reference role: one process trains the policy, generates with the
very same module (no weight copy for the ``hf`` engine) and holds the frozen reference policy.
"""

from __future__ import annotations

import socket
from typing import Any

import ray
import torch

from alignctl.algos import agg_loss, get_policy_loss, kl_penalty
from alignctl.batch import Batch
from alignctl.config.core import build_config
from alignctl.config.rl import RLConfig
from alignctl.models.forward import compute_log_probs
from alignctl.rollout import build_rollout_engine, engine_entry
from alignctl.rollout.engine import module_probe_log_probs
from alignctl.workers.checkpoint import load_training_state, save_training_state
from alignctl.workers.batch_transfer import autocast, float32_output_head, on_worker_device
from alignctl.workers.generation import generate_batch, with_tools
from alignctl.workers.microbatching import MicroBatchPlan
from alignctl.workers.model_setup import build_policy, resolve_packing_settings, save_hf_folder
from alignctl.workers.rollout_sync import RolloutSyncCheck
from alignctl.workers.train_engine import TrainEngine
from alignctl.workers.update_loop import run_update
from alignctl.workers.weight_channel import WeightChannel
from alignctl.workers.worker_process import DistContext, listening_socket


class ActorRolloutRefWorker:
    """Role ``actor``: ``generate_sequences``, ``compute_log_prob``, ``compute_ref_log_prob``,
    ``update_actor``, ``save``."""

    def __init__(self, ctx: DistContext, config: dict[str, Any], total_steps: int) -> None:
        self.ctx = ctx
        self.cfg: RLConfig = build_config(RLConfig, config)
        resolve_packing_settings(self.cfg, ctx.device)
        arr = self.cfg.actor_rollout_ref
        torch.manual_seed(self.cfg.trainer.seed)
        self.policy = build_policy(self.cfg, ctx, total_steps)
        self.engine: TrainEngine = self.policy.engine
        self.tokenizer = self.policy.tokenizer
        # With a rollout pool of its own (trainer.placement.rollout) the actor only trains and exports
        # its weights; otherwise it generates itself (the hybrid engine).
        self.rollout = None if self.cfg.separate_rollout else with_tools(
            build_rollout_engine(arr.rollout, self.policy.rollout_setup(self.cfg)), self.cfg, self.tokenizer,
            self.policy.eos_ids)
        self.sync_check = RolloutSyncCheck(arr.rollout.verify_sync, arr.rollout.sync_check_tol)
        self.weight_channel: WeightChannel | None = None  # rank 0, rollout.weight_transport=collective
        self._channel_listener: socket.socket | None = None  # rank 0, until the channel serves on it
        self.plan = MicroBatchPlan(arr.actor.ppo_micro_batch_size_per_gpu, arr.actor.use_dynamic_bsz,
                                   arr.actor.ppo_max_token_len_per_gpu)
        self.shuffle_gen = torch.Generator().manual_seed(self.cfg.trainer.seed + ctx.rank)
        # An engine that runs the trainer's module follows trainer.precision; others pick their own dtype.
        follows_trainer = engine_entry(arr.rollout.name).capabilities.trainer_precision
        self.rollout_precision = self.cfg.trainer.precision if follows_trainer else "fp32"
        if self.cfg.trainer.precision == "bf16":
            for module in (self.policy.model, getattr(self.policy.ref_engine, "model", None)):
                if module is not None:
                    float32_output_head(module, ctx.device)

    # ------------------------------------------------------------------ rollout

    def generate_sequences(self, prompts: Batch) -> Batch:
        step = prompts.meta.get("global_step", 0) + 1  # the step this rollout serves
        return generate_batch(
            self.rollout, prompts, max_new_tokens=self.cfg.data.max_response_length, rank=self.ctx.rank,
            device=self.ctx.device, precision=self.rollout_precision, pad_id=self.policy.pad_id,
            free_cache=self.cfg.actor_rollout_ref.rollout.free_cache_engine,
            before=lambda: self._sync_rollout_weights(prompts["prompt_ids"][0], step),
            extra_metrics=lambda: self.sync_check.metrics)

    @torch.no_grad()
    def export_rollout_weights(self, probe: list[int]) -> dict[str, Any] | None:
        """For a rollout pool of its own: the policy's complete weights (merged under LoRA) and the
        trainer's log-probs of ``probe``, which the rollout workers check their engine against.
        Collective; rank 0 returns them, the others None."""
        weights, probe_log_probs = self._rollout_payload(probe)
        if self.ctx.rank != 0:
            return None
        return {"weights": [(name, t.cpu()) for name, t in weights],  # through Ray's object store
                "probe": list(probe), "probe_log_probs": probe_log_probs}

    def _rollout_payload(self, probe: list[int]) -> tuple[list[tuple[str, torch.Tensor]], torch.Tensor]:
        """What a rollout pool of its own receives, whatever the transport: the complete weights and
        the trainer's log-probs of ``probe``. Collective (every rank gathers)."""
        weights = self.policy.rollout_weights()
        with self.engine.gathered() as model:
            return weights, module_probe_log_probs(model, probe)

    def weight_channel_address(self) -> tuple[str, int] | None:
        """Rank 0 (``rollout.weight_transport=collective``): the address the rollout pool joins the
        weight channel on; the socket stays open until ``open_weight_channel`` serves on it."""
        if self.ctx.rank != 0:
            return None
        self._channel_listener = listening_socket(ray.util.get_node_ip_address())
        return self._channel_listener.getsockname()[:2]

    def open_weight_channel(self, size: int) -> None:
        """Rank 0 joins the weight channel as its sender (blocks until the ``size - 1`` rollout workers
        have joined); the other ranks have no part in it."""
        if self.ctx.rank == 0 and self._channel_listener is not None:
            addr, port = self._channel_listener.getsockname()[:2]
            self.weight_channel = WeightChannel.open(addr, port, 0, size, self.ctx.device, self._channel_listener)
            self._channel_listener = None  # the store owns its descriptor now

    @torch.no_grad()
    def send_rollout_weights(self, probe: list[int]) -> None:
        """``export_rollout_weights`` over the weight channel: rank 0 broadcasts the tensors where they
        are (on the GPU under NCCL) with the probe's log-probs in the header; in asynchronous RL from
        a thread, returning at once. Collective (every rank gathers)."""
        weights, probe_log_probs = self._rollout_payload(probe)
        if self.ctx.rank != 0:
            return
        header = {"probe": list(probe), "probe_log_probs": probe_log_probs.tolist()}
        if self.cfg.trainer.async_rollout.max_staleness == 0:
            self.weight_channel.send(weights, header)  # the trainer waits for this sync anyway
            return
        # Asynchronous RL: the rollout workers may be busy with a queued batch. Send from a thread so
        # the actor trains on meanwhile, from a copy the next optimizer step cannot change under it.
        self.weight_channel.send_in_background([(name, t.detach().clone()) for name, t in weights], header)

    def close(self) -> None:
        """The process keeps running for the next run (parked workers): leave the weight channel."""
        if self.weight_channel is not None:
            self.weight_channel.close()
            self.weight_channel = None

    def _sync_rollout_weights(self, first_prompt: list[int], step: int) -> None:
        """``hf`` generates with the training module itself: nothing to do. An engine with its own copy
        (vllm, or hf's low-precision copy) gets the current full weights before every rollout; where
        the engine can score a probe, the sync is verified against the trainer's own log-probs."""
        if not self.rollout.holds_own_weights:
            return
        if self.policy.rollout_model is not None:
            with self.engine.gathered() as model:
                # hf's own bf16 copy takes the weights by name, cast on copy; a tied output projection is
                # listed under its own name too, for the copy's untied float32 head.
                self.rollout.sync_weights(model.named_parameters(remove_duplicate=False))
            return
        self.rollout.sync_weights(self.policy.rollout_weights())
        with self.engine.gathered() as model:
            self.sync_check.verify(self.rollout, model, first_prompt, step)

    # ------------------------------------------------------------------ log-probs

    def _log_probs(self, model: Any, batch: Batch, micro: int | None, entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
        logps, ents = [], []
        for part in batch.split(micro or len(batch)):
            with autocast(self.ctx.device, self.cfg.trainer.precision):
                out = compute_log_probs(
                    model, part["input_ids"], part["attention_mask"], part["responses"].shape[1],
                    position_ids=part["position_ids"], temperature=batch.meta["temperature"],
                    compute_entropy=entropy, use_remove_padding=self.cfg.actor_rollout_ref.model.use_remove_padding,
                    max_tokens_per_row=self.cfg.actor_rollout_ref.model.max_packed_row_tokens,
                    share_prompt=self.cfg.actor_rollout_ref.model.share_prompt)
            logps.append(out.log_probs)
            ents.append(out.entropy)
        return torch.cat(logps), (torch.cat(ents) if entropy else None)

    @torch.no_grad()
    @on_worker_device
    def compute_log_prob(self, batch: Batch) -> Batch:
        """Log-probs of the sampled responses under the current policy (PPO's "old" policy)."""
        micro = self.cfg.actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu
        with self.engine.gathered() as model:
            logp, ent = self._log_probs(model, batch, micro, entropy=True)
        return Batch({"old_log_probs": logp, "entropys": ent})

    @torch.no_grad()
    @on_worker_device
    def compute_ref_log_prob(self, batch: Batch) -> Batch:
        micro = self.cfg.actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu
        with self.policy.reference() as ref:
            logp, _ = self._log_probs(ref, batch, micro, entropy=False)
        return Batch({"ref_log_prob": logp})

    # ------------------------------------------------------------------ update

    @on_worker_device
    def update_actor(self, batch: Batch) -> dict[str, float]:
        actor = self.cfg.actor_rollout_ref.actor
        mini_rows = actor.ppo_mini_batch_size * self.cfg.actor_rollout_ref.rollout.n // self.ctx.world_size
        return run_update(self.engine, batch, self.plan, mini_rows=mini_rows, epochs=actor.ppo_epochs,
                          shuffle=actor.shuffle, generator=self.shuffle_gen, world_size=self.ctx.world_size,
                          grad_clip=actor.grad_clip, loss_fn=self._micro_batch_loss, prefix="actor")

    def _micro_batch_loss(self, part: Batch, n_tok: torch.Tensor, n_seq: torch.Tensor
                          ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        actor = self.cfg.actor_rollout_ref.actor
        mask = part["response_mask"]
        counts = {"global_num_tokens": n_tok, "global_num_seqs": n_seq,
                  "norm_length": self.cfg.data.max_response_length}
        with autocast(self.ctx.device, self.cfg.trainer.precision):
            out = compute_log_probs(
                self.engine.module, part["input_ids"], part["attention_mask"], mask.shape[1],
                position_ids=part["position_ids"], temperature=part.meta["temperature"], compute_entropy=True,
                use_remove_padding=self.cfg.actor_rollout_ref.model.use_remove_padding,
                # One packed row = one forward per micro-batch. Every engine needs that: DDP broadcasts
                # buffers in each forward and FSDP2/ZeRO-3 gather parameters, so ranks must run the same
                # number of forwards (the micro-batch count is agreed); DDP also wants one forward per
                # backward. Bound the row with the micro-batch size or use_dynamic_bsz instead.
                max_tokens_per_row=None, share_prompt=self.cfg.actor_rollout_ref.model.share_prompt)
        # On-policy steps skip the old-log-prob pass: the sampling policy is the current one.
        old = part["old_log_probs"] if "old_log_probs" in part else out.log_probs.detach()
        # Rollout correction's weights (0 for a rejected response) scale each token's loss: every built-in
        # loss is positively homogeneous in the advantage, so weighting the advantage does exactly that.
        advantages = part["advantages"]
        if "rollout_is_weights" in part:
            advantages = advantages * part["rollout_is_weights"]
        pg_loss, diag = get_policy_loss(actor.policy_loss.loss_mode)(
            old, out.log_probs, advantages, mask,
            loss_agg_mode=actor.loss_agg_mode, clip_ratio=actor.clip_ratio, clip_ratio_low=actor.clip_ratio_low,
            clip_ratio_high=actor.clip_ratio_high, clip_ratio_c=actor.clip_ratio_c, **counts)
        entropy = agg_loss(out.entropy, mask, actor.loss_agg_mode, **counts)
        # Without an entropy bonus the entropy is only reported: keep it out of the graph (no backward).
        loss = pg_loss - actor.entropy_coeff * entropy if actor.entropy_coeff else pg_loss
        metrics = {"actor/pg_loss": pg_loss.detach(), "actor/entropy": entropy.detach(),
                   "actor/pg_clipfrac": diag["pg_clipfrac"], "actor/pg_clipfrac_lower": diag["pg_clipfrac_lower"],
                   "actor/ppo_kl": diag["ppo_kl"]}
        if actor.use_kl_loss:
            kl = agg_loss(kl_penalty(out.log_probs, part["ref_log_prob"], actor.kl_loss_type), mask,
                          actor.loss_agg_mode, **counts)
            loss = loss + actor.kl_loss_coef * kl
            metrics["actor/kl_loss"] = kl.detach()
        metrics["actor/loss"] = loss.detach()
        return loss, metrics

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, folder: str) -> None:
        """Weights, optimizer, LR schedule and this rank's random state (collective)."""
        save_training_state(self.engine, folder, self.ctx.rank, {"shuffle": self.shuffle_gen})

    def load_checkpoint(self, folder: str) -> None:
        load_training_state(self.engine, folder, self.ctx.rank, {"shuffle": self.shuffle_gen})

    # ------------------------------------------------------------------ saving

    def save(self, path: str) -> None:
        """The policy in HF format (safetensors + tokenizer); collective, rank 0 writes."""
        save_hf_folder(self.policy, path, is_writer=self.ctx.rank == 0)
