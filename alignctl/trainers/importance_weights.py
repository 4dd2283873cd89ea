"""algorithm.rollout_correction in the loop: the importance weights the actor's loss multiplies.

The math is alignctl.algos.rollout_correction; this module reads the config and the batch.
"""

from __future__ import annotations

from alignctl.algos import rollout_correction_weights
from alignctl.batch import Batch
from alignctl.config.rl import RolloutCorrection
from alignctl.errors import UserError


def apply_rollout_correction(batch: Batch, corr: RolloutCorrection) -> tuple[Batch, dict[str, float]]:
    """``batch`` with ``rollout_is_weights [B, T]`` (what the actor multiplies each token's loss by;
    0 for a rejected response) and the weights' ``rollout_corr/*`` metrics; unchanged with mode none."""
    if corr.mode == "none":
        return batch, {}
    if "rollout_log_probs" not in batch:
        raise UserError(f"key 'algorithm.rollout_correction.mode' ({corr.mode}) needs the rollout engine's log-probs "
                        "of the sampled tokens, and this engine returned none; use mode none")
    weights, diagnostics = rollout_correction_weights(
        batch["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"], corr.mode,
        cap=corr.cap, low=corr.mask_low, high=corr.mask_high)
    metrics = {f"rollout_corr/{name}": float(value) for name, value in diagnostics.items()}
    return batch.union(Batch({"rollout_is_weights": weights})), metrics
