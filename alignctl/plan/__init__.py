"""Memory planning before a run: pure formulas (memory.py), the RL config reader (estimate.py) and
its printing (report.py). ``alignctl plan`` prints a plan; ``alignctl ppo``/``grpo`` refuse a run
whose peak does not fit (``check_fits``)."""

from __future__ import annotations

from alignctl.config.rl import RLConfig
from alignctl.errors import UserError
from alignctl.plan.estimate import Plan, model_shape, model_shapes, plan_rl, what_ifs

__all__ = ["Plan", "check_fits", "make_plan", "model_shape", "model_shapes", "plan_rl"]


def make_plan(cfg: RLConfig, device_memory: int | None = None) -> tuple[Plan, list[tuple[str, int]]]:
    """The plan of ``cfg`` and the changes that would lower its peak (each with its new peak)."""
    shapes = model_shapes(cfg)
    result = plan_rl(cfg, device_memory, shapes)
    return result, what_ifs(cfg, result, shapes)


def check_fits(cfg: RLConfig, device_memory: int | None = None) -> None:
    """The pre-flight memory check: a one-line error when the peak exceeds the device memory."""
    from alignctl.plan.plan_report import fit_error

    result, changes = make_plan(cfg, device_memory)
    if not result.fits:
        raise UserError(fit_error(result, changes))

