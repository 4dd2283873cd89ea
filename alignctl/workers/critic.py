"""The critic role: a value model (a one-label ``*ForTokenClassification``) trained on GAE returns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from alignctl.algos import compute_value_loss
from alignctl.batch import Batch
from alignctl.config.core import build_config
from alignctl.config.rl import RLConfig
from alignctl.errors import UserError
from alignctl.models.attention import resolve_attn_implementation
from alignctl.models.blocks import freeze_bottom_layers
from alignctl.models.compat import enable_activation_checkpointing
from alignctl.models.forward import compute_values
from alignctl.models.loading import load_value_model
from alignctl.workers.checkpoint import load_training_state, save_training_state
from alignctl.workers.batch_transfer import autocast, on_worker_device
from alignctl.workers.worker_process import DistContext
from alignctl.workers.microbatching import MicroBatchPlan
from alignctl.workers.model_setup import attach_optimizer, resolve_packing_settings
from alignctl.workers.strategy import make_engine
from alignctl.workers.update_loop import run_update

# Names the parameter layout of the saved critic state (``model.*`` + ``score.*`` of a one-label
# token classifier). Checkpoints without it hold the old ``backbone.*`` + ``value_head.*`` layout.
LAYOUT_FILE = "critic_layout.txt"
LAYOUT = "token-classification/1"


class CriticWorker:
    """Role ``critic``: ``compute_values``, ``update_critic``."""

    def __init__(self, ctx: DistContext, config: dict[str, Any], total_steps: int) -> None:
        self.ctx = ctx
        self.cfg: RLConfig = build_config(RLConfig, config)
        resolve_packing_settings(self.cfg, ctx.device)
        critic = self.cfg.critic
        arr = self.cfg.actor_rollout_ref
        torch.manual_seed(self.cfg.trainer.seed + 1)
        attn = resolve_attn_implementation(arr.model.attn_implementation, device=ctx.device,
                                           packing=critic.model.use_remove_padding)
        model = load_value_model(critic.model.path or arr.model.path, dtype=arr.model.dtype, attn_implementation=attn)
        offload = critic.strategy == "fsdp2" and critic.model.fsdp_config.offload_policy
        if ctx.device == "cuda" and not offload:  # offloaded, fully_shard moves one unit at a time
            model = model.cuda()
        # Before the engine wraps it: DDP and the optimizer take only the parameters that train.
        freeze_bottom_layers(model, critic.model.freeze_layers, f"critic.model.path '{critic.model.path or arr.model.path}'",
                             key="critic.model.freeze_layers")
        if critic.model.enable_gradient_checkpointing:
            enable_activation_checkpointing(model)
        self.model = model
        self.engine = make_engine(critic.strategy, model, world_size=ctx.world_size, fsdp_offload=offload,
                                  options=critic.deepspeed, key="critic.deepspeed")
        attach_optimizer(self.engine, model, critic.optim, total_steps)
        self.plan = MicroBatchPlan(critic.ppo_micro_batch_size_per_gpu, critic.use_dynamic_bsz,
                                   critic.ppo_max_token_len_per_gpu)
        self.shuffle_gen = torch.Generator().manual_seed(self.cfg.trainer.seed + 7 + ctx.rank)

    def _values(self, model: Any, part: Batch, training: bool = False) -> torch.Tensor:
        # Training: one packed row (= one forward) per micro-batch, as in the actor (see there).
        row_budget = None if training else self.cfg.actor_rollout_ref.model.max_packed_row_tokens
        with autocast(self.ctx.device, self.cfg.trainer.precision):
            values = compute_values(model, part["input_ids"], part["attention_mask"], part["responses"].shape[1],
                                    position_ids=part["position_ids"],
                                    use_remove_padding=self.cfg.critic.model.use_remove_padding,
                                    max_tokens_per_row=row_budget, share_prompt=self.cfg.critic.model.share_prompt)
        return values.float()  # the value head ran in bf16 under autocast; the loss and GAE want float32

    @torch.no_grad()
    @on_worker_device
    def compute_values(self, batch: Batch) -> Batch:
        micro = self.cfg.critic.ppo_micro_batch_size_per_gpu or len(batch)
        with self.engine.gathered() as model:
            values = torch.cat([self._values(model, part) for part in batch.split(micro)])
        return Batch({"values": values * batch["response_mask"]})

    def _loss(self, part: Batch, n_tok: torch.Tensor, n_seq: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        critic = self.cfg.critic
        vpreds = self._values(self.engine.module, part, training=True)
        loss, clipfrac = compute_value_loss(
            vpreds, part["returns"], part["values"], part["response_mask"], critic.cliprange_value,
            critic.loss_agg_mode, global_num_tokens=n_tok, global_num_seqs=n_seq,
            norm_length=self.cfg.data.max_response_length)
        return loss, {"critic/vf_loss": loss.detach(), "critic/vf_clipfrac": clipfrac}

    @on_worker_device
    def update_critic(self, batch: Batch) -> dict[str, float]:
        critic, actor = self.cfg.critic, self.cfg.actor_rollout_ref.actor
        prompts = critic.ppo_mini_batch_size or actor.ppo_mini_batch_size
        mini_rows = prompts * self.cfg.actor_rollout_ref.rollout.n // self.ctx.world_size
        return run_update(self.engine, batch, self.plan, mini_rows=mini_rows,
                          epochs=critic.ppo_epochs or actor.ppo_epochs, shuffle=actor.shuffle,
                          generator=self.shuffle_gen, world_size=self.ctx.world_size,
                          grad_clip=critic.grad_clip, loss_fn=self._loss, prefix="critic")

    # ------------------------------------------------------------------ checkpoints

    def save_checkpoint(self, folder: str) -> None:
        """Weights, optimizer, LR schedule and this rank's random state (collective)."""
        save_training_state(self.engine, folder, self.ctx.rank, {"shuffle": self.shuffle_gen})
        if self.ctx.rank == 0:
            (Path(folder) / LAYOUT_FILE).write_text(LAYOUT + "\n", encoding="utf-8")

    def load_checkpoint(self, folder: str) -> None:
        layout = Path(folder) / LAYOUT_FILE
        if not layout.is_file() or layout.read_text(encoding="utf-8").strip() != LAYOUT:
            raise UserError(f"{folder}: critic state written by an older alignctl (value head outside a "
                            f"token-classification model); start over with trainer.resume_mode=disable")
        load_training_state(self.engine, folder, self.ctx.rank, {"shuffle": self.shuffle_gen})
