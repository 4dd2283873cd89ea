"""Typed configuration: schemas per stage, YAML loading, dotted overrides, validation."""

from __future__ import annotations

import importlib

from alignctl.config.core import build_config, field, iter_keys, load_config, section, to_dict, to_yaml
from alignctl.errors import UserError

# Stage name -> "module:Class" of its schema. Imported lazily so `alignctl --help` stays fast.
STAGE_SCHEMAS: dict[str, str] = {
    "preprocess": "alignctl.config.preprocess:PreprocessConfig",
    "ppo": "alignctl.config.rl:RLConfig",
    "grpo": "alignctl.config.rl:RLConfig",
    "eval": "alignctl.config.eval:EvalConfig",
    "init-model": "alignctl.config.init_model:InitModelConfig",
    "import-model": "alignctl.config.import_model:ImportModelConfig",
    "sft": "alignctl.config.sft:SFTConfig",
    "train-rm": "alignctl.config.train_rm:RewardModelConfig",
}


def stage_schema(stage: str) -> type:
    """The schema class of a stage; unknown stage -> UserError listing the valid ones."""
    if stage not in STAGE_SCHEMAS:
        raise UserError(f"unknown stage {stage!r}; expected one of {', '.join(sorted(STAGE_SCHEMAS))}")
    module, name = STAGE_SCHEMAS[stage].split(":")
    return getattr(importlib.import_module(module), name)


__all__ = ["STAGE_SCHEMAS", "build_config", "field", "iter_keys", "load_config", "section",
           "stage_schema", "to_dict", "to_yaml"]
