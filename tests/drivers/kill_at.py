"""Run ``alignctl ppo`` in-process and SIGKILL the whole job (controller, Ray, workers) at a chosen
point, as a preemption would: ``python kill_at.py POINT:STEP override ...`` (POINT:STEP may be
``none``). Used by tests/test_resume_kill.py; start it in its own session so the kill stays there.

Points (STEP is the 1-based step being run or just finished):
  mid_step          after the actor update of STEP, before its metrics are logged or saved
  checkpoint_write  STEP's checkpoint fully written by every worker, not yet committed
  after_commit      right after STEP's checkpoint was committed
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from alignctl.config import load_config
from alignctl.config.rl import RLConfig
from alignctl.trainers.rl_trainer import RLTrainer


def kill_job() -> None:
    sys.stdout.flush()
    os.killpg(os.getpgrp(), signal.SIGKILL)


class KillingTrainer(RLTrainer):
    def __init__(self, cfg: RLConfig, point: str, step: int) -> None:
        super().__init__(cfg)
        self.point, self.kill_step = point, step

    def updates(self, batch, timer):
        metrics = super().updates(batch, timer)  # the critic's and the actor's updates of this step
        if self.point == "mid_step" and self.global_step + 1 == self.kill_step:
            kill_job()
        return metrics

    def commit_checkpoint(self, partial: Path) -> Path:
        if self.point == "checkpoint_write" and self.global_step == self.kill_step:
            kill_job()
        final = super().commit_checkpoint(partial)
        if self.point == "after_commit" and self.global_step == self.kill_step:
            kill_job()
        return final


def main() -> None:
    spec, overrides = sys.argv[1], sys.argv[2:]
    point, step = ("none", 0) if spec == "none" else (spec.split(":")[0], int(spec.split(":")[1]))
    cfg = load_config(RLConfig, None, overrides)
    KillingTrainer(cfg, point, step).fit()


if __name__ == "__main__":
    main()
