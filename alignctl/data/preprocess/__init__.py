"""The preprocess stage: a raw dataset -> verl-compatible parquet files (see ``alignctl.data.schema``).

    report = run_preprocess(load_config(PreprocessConfig, overrides=["dataset=gsm8k", ...]))

Preprocessors are looked up by name in :data:`PREPROCESSORS` (``module:function``, imported only
when used); each one is ``build(ctx: Context) -> None``. Output goes into a temporary folder
renamed to ``cfg.out`` only when everything succeeded, with a ``meta.json`` describing the run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from alignctl.config.preprocess import PreprocessConfig
from alignctl.data.preprocess.common import Context, PreprocessReport
from alignctl.errors import UserError, writing
from alignctl.pipeline.atomic import atomic_output_dir

PREPROCESSORS: dict[str, str] = {
    "gsm8k": "alignctl.data.preprocess.gsm8k:build",
    "math": "alignctl.data.preprocess.math:build",
    "hh-rlhf": "alignctl.data.preprocess.hh_rlhf:build",
    "arith": "alignctl.data.preprocess.arith:build",
    "tools-arith": "alignctl.data.preprocess.tools_arith:build",
    "custom": "alignctl.data.preprocess.custom:build",
}


def get_preprocessor(name: str) -> Callable[[Context], None]:
    if name not in PREPROCESSORS:
        raise UserError(f"unknown dataset {name!r}; expected one of {', '.join(PREPROCESSORS)}")
    module, function = PREPROCESSORS[name].split(":")
    return getattr(importlib.import_module(module), function)


def _check_unused_keys(cfg: PreprocessConfig) -> None:
    """Keys that only ``custom`` reads would be silently ignored elsewhere: say so instead."""
    if cfg.dataset != "custom" and cfg.map_fn is not None:
        raise UserError(f"preprocess {cfg.dataset}: key 'map_fn' is only used by dataset 'custom'")
    if cfg.dataset != "custom" and cfg.kind != "rl":
        raise UserError(f"preprocess {cfg.dataset}: key 'kind' is only used by dataset 'custom'")


def run_preprocess(cfg: PreprocessConfig, *, progress: bool = True) -> PreprocessReport:
    """Write ``cfg.dataset`` as parquet into ``cfg.out`` (atomically) and report the counts."""
    cfg.validate()
    _check_unused_keys(cfg)
    build = get_preprocessor(cfg.dataset)
    # A full disk or read-only --out: one line naming the output (the temporary folder is removed).
    with writing(cfg.out), atomic_output_dir(cfg.out) as tmp:
        ctx = Context(cfg, tmp, progress=progress)
        build(ctx)
        ctx.write_meta()
    return ctx.report(Path(cfg.out).absolute())


__all__ = ["PREPROCESSORS", "PreprocessReport", "get_preprocessor", "run_preprocess"]
