"""Config schema of the reward-model stage (``alignctl train-rm``), run on ``trl.RewardTrainer``.

The model, optimizer and loop sections are the SFT stage's (same keys, same meaning).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from alignctl.config.core import field, section
from alignctl.config.sft import ModelConfig, OptimConfig, SFTTrainerConfig, check_loop_keys, check_model_keys
from alignctl.errors import UserError


@dataclass
class RMDataConfig:
    """Preference pairs: parquet files with prompt, chosen and rejected columns."""

    train_files: list[str] = field(default_factory=list, help="Training preference parquet file(s). Required "
                                                              "by `alignctl train-rm` (the Python API takes a dataset).")
    val_files: list[str] = field(default_factory=list, help="Held-out preference parquet file(s); none: "
                                                            "data.val_fraction of the training pairs is held out.")
    val_fraction: float = field(0.1, help="Held-out fraction of the training pairs when no val_files are "
                                          "given (0: no held-out evaluation).")
    max_length: int | None = field(512, help="Pairs whose chosen or rejected sequence (prompt included) is "
                                             "longer than this many tokens are dropped and counted (null: keep all).")
    max_samples: int | None = field(None, help="Use at most this many training pairs (quick runs).")
    margin_key: str | None = field("margin", help="Column holding a per-pair margin for the Bradley-Terry loss, "
                                                  "used when present (null: never use a margin).")
    group_key: str | None = field(None, help="Column of the held-out pairs (or 'column.key' inside a dict column, "
                                             "e.g. extra_info.rejected_kind) whose values split the held-out "
                                             "accuracy into groups: val/accuracy/<value> per group (null: none).")


@dataclass
class RewardModelConfig:
    """Train a scalar reward model (sequence classifier, one label) on chosen/rejected pairs."""

    model: ModelConfig = section(ModelConfig, help="Starting checkpoint: a causal LM (SFT or init-model "
                                                   "output) gets a new score head; a reward model keeps its own.")
    data: RMDataConfig = section(RMDataConfig, help="Preference data.")
    optim: OptimConfig = section(OptimConfig, help="Optimizer.")
    trainer: SFTTrainerConfig = section(SFTTrainerConfig, help="Training loop.")
    output_dir: str = field("runs/reward_model", help="Output reward-model folder (written atomically).")
    score_from: Literal["head", "likelihood"] = field("head", help="head: a score head on the last token (a "
                                          "*ForSequenceClassification model, TRL's reward model). likelihood: the causal LM "
                                          "itself scores a reply by likelihood_beta x its summed log-probability and is trained "
                                          "by the same Bradley-Terry loss on those scores (no reference model); needs a chat "
                                          "template, saves a causal LM (alignctl/models/reply_likelihood.py). With "
                                          "trainer.max_steps=0 nothing trains: the start model's likelihood is evaluated "
                                          "on the held-out pairs and saved as the reward model.")
    loss: Literal["bradley_terry", "on_track"] = field("bradley_terry", help="bradley_terry: TRL's pairwise loss "
                                          "on the scores at each reply's last token. on_track: also read the score head at "
                                          "every token after the point where a pair's two replies part and train it as a "
                                          "classifier, chosen tokens 1 and rejected tokens 0 (for pairs whose rejected reply "
                                          "corrupts the chosen one, e.g. one wrong step: it learns where it goes wrong; "
                                          "alignctl/algos/on_track.py), plus bt_weight x the pairwise loss. The score is read "
                                          "at the last token either way. score_from=head only.")
    bt_weight: float = field(1.0, help="loss=on_track: weight of the pairwise (Bradley-Terry) loss added to the "
                                       "on-track loss (0: the on-track loss alone).")
    likelihood_beta: float = field(1.0, help="score_from=likelihood: the reward is this x the reply's summed "
                                             "log-probability (the temperature of the Bradley-Terry loss).")
    center_rewards_coefficient: float | None = field(None, help="Weight of the mean((r_chosen + r_rejected)^2) "
                                                               "term that centres rewards on 0 (TRL; 0.01 is usual).")
    share_prompt: bool | Literal["auto"] = field("auto", help="Compute the part a pair's chosen and rejected sequences "
                                          "share (the prompt and any common start of the answers) once per pair in every "
                                          "forward pass (alignctl/models/reward_forward.py): same scores to float rounding, "
                                          "fewer tokens (score_from=likelihood: the prompt, everything before the reply). Attention 'auto' then picks "
                                          "alignctl_segment_sdpa. auto: on CPU only (on a GPU the padded batch is faster; "
                                          "docs/gpu_and_cluster.md).")
    audit: bool = field(True, help="Before training, run the cheap checks of 'alignctl audit' on the pairs (empty, "
                                   "chosen == rejected, exact duplicates, held-out prompts also in training, length "
                                   "bias) and warn about each finding; false skips them.")
    calibration_edges: list[float] = field(default_factory=lambda: [0.5, 1.0, 2.0, 4.0],
                                           help="Bucket edges of |r_chosen - r_rejected| for the held-out "
                                                "calibration table (accuracy by margin bucket).")

    def validate(self) -> None:
        if not self.model.path:
            raise UserError("train-rm: key 'model.path' is required (a Hugging Face model folder)")
        check_model_keys(self.model)
        loop = self.trainer
        if self.score_from == "likelihood" and loop.max_steps == 0:  # score only: the start model as it is
            loop = dataclasses.replace(loop, max_steps=None)
        check_loop_keys(loop, self.data.max_length, self.optim.lr, self.optim.warmup_ratio)
        if not 0.0 <= self.data.val_fraction < 1.0:
            raise UserError(f"key 'data.val_fraction' expected a number in [0, 1), got {self.data.val_fraction}")
        if self.data.max_samples is not None and self.data.max_samples <= 0:
            raise UserError(f"key 'data.max_samples' expected a positive integer, got {self.data.max_samples}")
        if self.data.group_key is not None and not self.data.group_key.strip(".").strip():
            raise UserError(f"key 'data.group_key' expected a column name (or 'column.key'), got {self.data.group_key!r}")
        if self.data.group_key is not None and not self.data.val_files and self.data.val_fraction == 0:
            raise UserError("key 'data.group_key' needs held-out pairs: set data.val_files or data.val_fraction > 0")
        if self.loss == "on_track" and self.score_from != "head":
            raise UserError("key 'loss': on_track trains a score head; it needs score_from=head, got "
                            f"score_from={self.score_from}")
        if not self.bt_weight >= 0:
            raise UserError(f"key 'bt_weight' expected a number >= 0, got {self.bt_weight}")
        if not self.likelihood_beta > 0:
            raise UserError(f"key 'likelihood_beta' expected a number > 0, got {self.likelihood_beta}")
        edges = self.calibration_edges
        if any(e <= 0 for e in edges) or any(b <= a for a, b in zip(edges, edges[1:])):
            raise UserError(f"key 'calibration_edges' expected increasing positive numbers, got {edges}")
        if self.center_rewards_coefficient is not None and self.center_rewards_coefficient < 0:
            raise UserError(f"key 'center_rewards_coefficient' expected a number >= 0, "
                            f"got {self.center_rewards_coefficient}")
