"""train-rm's ``loss: on_track``: TRL's RewardTrainer with the on-track cross-entropy added to its loss.

The model's forward (:func:`alignctl.models.reward_forward.use_token_scores_forward`) returns the
last-token scores TRL's Bradley-Terry loss, metrics and evaluation read, and the score head at every
token, which :func:`alignctl.algos.on_track.on_track_loss` trains. The loss is
``on_track + bt_weight x TRL's Bradley-Terry loss`` (its margin and centring term included).
"""

from __future__ import annotations

from typing import Any

import trl

from alignctl.algos.on_track import on_track_loss
from alignctl.models.reward_forward import pair_prompt_lengths

__all__ = ["OnTrackRewardTrainer"]


class OnTrackRewardTrainer(trl.RewardTrainer):
    """A ``trl.RewardTrainer`` whose loss adds the on-track cross-entropy (module docstring)."""

    def __init__(self, *args: Any, bt_weight: float, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.bt_weight = bt_weight

    def compute_loss(self, model: Any, inputs: dict[str, Any], return_outputs: bool = False,
                     num_items_in_batch: Any = None) -> Any:
        bt, outputs = super().compute_loss(model, inputs, return_outputs=True, num_items_in_batch=num_items_in_batch)
        keep = inputs["attention_mask"].bool()
        scores = [row[k] for row, k in zip(outputs.token_scores, keep)]
        ids = [row[k].tolist() for row, k in zip(inputs["input_ids"], keep)]
        half = len(ids) // 2  # TRL's collator: the chosen sequences, then the rejected ones
        # where each pair parts = the prefix the shared-prompt forward computes once for the pair
        on_track = on_track_loss(scores[:half], scores[half:], pair_prompt_lengths(ids)[:half])
        self._metrics["train" if self.model.training else "eval"]["on_track_loss"].append(on_track.item())
        loss = on_track + self.bt_weight * bt
        return (loss, outputs) if return_outputs else loss
