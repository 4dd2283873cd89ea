"""Which RL loop a config asks for. Kept apart from both loops so that ``dapo`` (a subclass of
the base loop) and ``rl_trainer`` import only downward."""

from __future__ import annotations

from alignctl.config.rl import RLConfig
from alignctl.trainers.dapo import DAPOTrainer
from alignctl.trainers.rl_trainer import RLTrainer


def create_trainer(cfg: RLConfig) -> RLTrainer:
    """The loop for a config: DAPO's dynamic sampling when algorithm.filter_groups.enable."""
    if cfg.algorithm.filter_groups.enable:
        return DAPOTrainer(cfg)
    return RLTrainer(cfg)
