"""Verifying that a rollout engine with its own weight copy generates with the trainer's weights.

After every sync the engine scores a fixed probe sequence (the first prompt the worker saw, at most
``PROBE_TOKENS`` tokens) and the trainer scores it too, in float32 without autocast. A sync that
left a tensor stale (a skipped name, a LoRA adapter that never reached the engine) moves the
engine's log-probs away from the trainer's by far more than kernel noise, and the run stops with one
line naming the step. Cost: one forward of the probe on each side per step.

Default tolerance (``rollout.sync_check_tol: null``): 1e-3 when the engine computes in float32
(kernel noise measured ~1e-6), 0.5 in bf16 / fp16, where rounding alone moves log-probs by a few
hundredths; the low-precision bound catches a wrong or stale layer, not a slightly stale one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from alignctl.errors import RunFailed
from alignctl.rollout.engine import RolloutEngine, module_probe_log_probs

PROBE_TOKENS = 64
FLOAT32_TOLERANCE = 1e-3
LOW_PRECISION_TOLERANCE = 0.5


class RolloutSyncCheck:
    """Per-worker state of the check: the probe, the tolerance, the latest difference."""

    def __init__(self, enabled: bool, tolerance: float | None) -> None:
        self.enabled = enabled
        self.tolerance = tolerance
        self.probe: list[int] | None = None
        self.metrics: dict[str, float] = {}

    def verify(self, engine: RolloutEngine, model: nn.Module, first_prompt: Sequence[int], step: int) -> None:
        if not self.enabled:
            return
        if self.probe is None:
            self.probe = [int(t) for t in first_prompt][:PROBE_TOKENS]
        if len(self.probe) < 2:
            return
        self.compare(engine, self.probe, module_probe_log_probs(model, self.probe), step)

    def compare(self, engine: RolloutEngine, probe: Sequence[int], trainer_log_probs: torch.Tensor, step: int) -> None:
        """The engine's log-probs of ``probe`` against the trainer's (computed here, or by the actor
        for a rollout pool of its own); RunFailed naming ``step`` when they differ too much."""
        if not self.enabled:
            return
        engine_lp = engine.probe_log_probs(probe)
        if engine_lp is None:
            return
        diff = float((engine_lp.float() - trainer_log_probs.float()).abs().max())
        tolerance = self.tolerance if self.tolerance is not None else default_tolerance(engine)
        self.metrics = {"rollout/sync_probe_max_abs_diff": diff}
        if not diff <= tolerance:  # NaN fails too
            raise RunFailed(f"rollout weight sync before step {step} did not take: the {engine.name} engine's "
                            f"log-probs of the probe sequence differ from the trainer's by {diff:.3g} (tolerance "
                            f"{tolerance:g}); a weight did not reach the rollout engine")


def default_tolerance(engine: Any) -> float:
    dtype = str(getattr(engine, "compute_dtype", "float32")).removeprefix("torch.")
    return FLOAT32_TOLERANCE if dtype == "float32" else LOW_PRECISION_TOLERANCE
