"""Memory planning before a run: pure formulas (memory.py), the RL config reader (estimate.py) and
its printing (report.py). ``alignctl plan`` prints a plan; ``alignctl ppo``/``grpo`` refuse a run
whose peak does not fit (``check_fits``)."""

from __future__ import annotations

from alignctl.config.rl import RLConfig
from alignctl.errors import UserError
from alignctl.plan.estimate import Plan, model_shape, plan_rl, what_ifs
from alignctl.plan.memory import ModelShape


def make_plan(cfg: RLConfig, device_memory: int | None = None) -> tuple[Plan, list[tuple[str, int]]]:
    """The plan of ``cfg`` and the changes that would lower its peak (each with its new peak)."""
    shapes = _shapes(cfg)
    result = plan_rl(cfg, device_memory, shapes)
    return result, what_ifs(cfg, result, shapes)


def check_fits(cfg: RLConfig, device_memory: int | None = None) -> None:
    """The pre-flight memory check: a one-line error when the peak exceeds the device memory."""
    from alignctl.plan.report import fit_error

    result, changes = make_plan(cfg, device_memory)
    if not result.fits:
        raise UserError(fit_error(result, changes))


def _shapes(cfg: RLConfig) -> dict[str, ModelShape]:
    """Each model's shape read once (the what-if plans reuse them)."""
    arr = cfg.actor_rollout_ref
    shapes = {"actor": model_shape(str(arr.model.path), "lm")}
    if cfg.use_critic:
        shapes["critic"] = model_shape(str(cfg.critic.model.path or arr.model.path), "value")
    if cfg.reward_model.enable:
        shapes["reward"] = model_shape(str(cfg.reward_model.model.path), "score")
    return shapes
