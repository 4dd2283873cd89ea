"""One validation pass over a whole resolved stage config, before anything runs or is written.

The typed schema already checked types, ranges and batch-size arithmetic when the config was
built (:mod:`alignctl.config`). Preflight checks the world the config points at: input files
exist and hold the columns the stage (and its reward) needs, model folders exist and are the
right kind (a reward model has a score head), local-looking paths never go to a hub, and the
output folder may be written (:mod:`alignctl.pipeline.ownership`). The CLI, the Python API and
the pipeline runner call :func:`preflight` before starting Ray or creating any folder; every
problem is a one-line :class:`~alignctl.errors.UserError`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from alignctl.preflight.context import Context


def _checkers() -> dict[type, Callable[[Any, Context], None]]:
    from alignctl.config.eval import EvalConfig
    from alignctl.config.import_model import ImportModelConfig
    from alignctl.config.init_model import InitModelConfig
    from alignctl.config.preprocess import PreprocessConfig
    from alignctl.config.rl import RLConfig
    from alignctl.config.sft import SFTConfig
    from alignctl.config.train_rm import RewardModelConfig
    from alignctl.preflight import rl_checks, stage_checks

    return {PreprocessConfig: stage_checks.check_preprocess, InitModelConfig: stage_checks.check_init_model,
            ImportModelConfig: stage_checks.check_import_model,
            SFTConfig: stage_checks.check_sft, RewardModelConfig: stage_checks.check_reward_model,
            EvalConfig: stage_checks.check_eval, RLConfig: rl_checks.check_rl}


def preflight(cfg: Any, *, overwrite: bool = False, pending: Collection[str] = (), outputs: bool = True,
              offline_ok: bool = False, python_scorer: bool = False) -> None:
    """Check everything ``cfg`` refers to; see :class:`~alignctl.preflight.context.Context` for the
    keyword arguments. Raises UserError on the first problem."""
    check = _checkers().get(type(cfg))
    if check is None:
        raise TypeError(f"no preflight for {type(cfg).__name__}")
    check(cfg, Context(overwrite=overwrite, pending=pending, outputs=outputs, offline_ok=offline_ok,
                       python_scorer=python_scorer))


__all__ = ["Context", "preflight"]
