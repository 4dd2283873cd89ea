"""Metric sinks: console (one line per step with a count and an ETA; a table of the key metrics per
step with ``--verbose``), jsonl (always, in the run folder), tensorboard and wandb (when their
extras are installed). ``Tracker.log(metrics, step)`` fans out to all."""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from rich.console import Console
from rich.table import Table

from alignctl.errors import UserError


class Sink(Protocol):
    def log(self, metrics: dict[str, float], step: int) -> None: ...

    def close(self) -> None: ...


class JsonlSink:
    def __init__(self, path: Path, *, append: bool = False) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.file = path.open("a" if append else "w", encoding="utf-8")

    def log(self, metrics: dict[str, float], step: int) -> None:
        row = {"step": step, **{k: (v if isinstance(v, (int, float)) and math.isfinite(v) else str(v))
                                for k, v in metrics.items()}}
        self.file.write(json.dumps(row) + "\n")
        self.file.flush()

    def close(self) -> None:
        self.file.close()


# The metrics a person watches, in the order shown; the rest go to the jsonl/tensorboard sinks.
CONSOLE_KEYS = (
    "critic/score/mean", "reward/p10", "reward/p50", "reward/p90", "actor/pg_loss", "actor/entropy",
    "actor/kl_loss", "actor/ppo_kl", "actor/pg_clipfrac", "actor/grad_norm", "critic/vf_loss",
    "response_length/mean", "response_length/clip_ratio", "timing_s/step", "perf/throughput",
)


class ConsoleSink:
    """The ``--verbose`` console: a table of :data:`CONSOLE_KEYS` per step."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(highlight=False)

    def log(self, metrics: dict[str, float], step: int) -> None:
        keys = [k for k in CONSOLE_KEYS if k in metrics] + sorted(k for k in metrics if k.startswith("val-core/"))
        table = Table(title=f"step {step}", title_justify="left", show_header=False, box=None, pad_edge=False)
        for key in keys:
            table.add_row(key, f"{metrics[key]:.4g}")
        self.console.print(table)

    def close(self) -> None:
        return None


VERBOSE_ENV = "ALIGNCTL_VERBOSE"  # set by `alignctl --verbose`; inherited by a pipeline's stage processes
REWARD_KEY = "critic/score/mean"
ALARM_PREFIX = "monitor/alarm/"  # set to 1 at the step an alarm fires (trainers/rl_trainer.py)
_KL = ("actor/reference_kl", "actor/kl_loss", "actor/ppo_kl")
STEP_LINE_START = "step "  # a stage's log is read for its last step line (pipeline/concurrent.py)


def duration_text(seconds: float) -> str:
    """6m40s, 1h02m, 45s: an ETA a person reads at a glance."""
    seconds = max(0, int(round(seconds)))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    if seconds >= 60:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds}s"


def gold_key(metrics: dict[str, Any]) -> str | None:
    """The per-step accuracy that is not the reward itself: a custom reward's own ``acc``, or the rule
    score beside a reward model (without one, the rule score is the reward)."""
    if "reward/extra/acc/mean" in metrics:
        return "reward/extra/acc/mean"
    if "reward/rm_score/mean" in metrics and "reward/rule_score/mean" in metrics:
        return "reward/rule_score/mean"
    return None


def step_line(metrics: dict[str, float], step: int, total: int | None, seconds_per_step: float | None) -> str:
    """``step 7/20 · 31 s/step · ETA 6m40s · reward 0.41 · gold 0.55 · kl 0.012 · len 23.4`` and the
    alarms that fired at this step; the pieces whose metric the run does not log are left out."""
    parts = [f"{STEP_LINE_START}{step}/{total}" if total else f"{STEP_LINE_START}{step}"]
    if seconds_per_step is not None:
        parts.append(f"{seconds_per_step:.3g} s/step")
        if total:
            parts.append(f"ETA {duration_text(seconds_per_step * max(0, total - step))}")
    if REWARD_KEY in metrics:
        parts.append(f"reward {metrics[REWARD_KEY]:.3g}")
    if (gold := gold_key(metrics)) is not None:
        parts.append(f"{'acc' if gold.startswith('reward/extra') else 'gold'} {metrics[gold]:.3g}")
    kl = next((k for k in _KL if k in metrics), None)
    if kl is not None:
        parts.append(f"kl {metrics[kl]:.3g}")
    if "response_length/mean" in metrics:
        parts.append(f"len {metrics['response_length/mean']:.3g}")
    alarms = sorted(k.removeprefix(ALARM_PREFIX) for k in metrics if k.startswith(ALARM_PREFIX))
    if alarms:
        parts.append("ALARM " + ", ".join(alarms))
    return " · ".join(parts)


def validation_line(metrics: dict[str, float], step: int, total: int | None) -> str:
    """``validation at step 10/20: openai/gsm8k acc/mean@1 0.55``."""
    scores = [f"{k.removeprefix('val-core/')} {v:.3g}" for k, v in sorted(metrics.items())
              if k.startswith("val-core/") and isinstance(v, (int, float))]
    where = f"{step}/{total}" if total else str(step)
    return f"validation at step {where}: " + (", ".join(scores) or "no scores")


class StepLineSink:
    """The default console: one line per training step (count, seconds per step, ETA, the few
    numbers a person watches), one per validation. The seconds per step are the wall-clock mean of
    the last :attr:`WINDOW` training steps seen by this sink (a validation pass is not counted)."""

    WINDOW = 5

    def __init__(self, total_steps: int | None, console: Console | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total = total_steps
        self.console = console or Console(highlight=False)
        self.clock = clock
        self.last = clock()
        self.durations: list[float] = []

    def log(self, metrics: dict[str, float], step: int) -> None:
        now = self.clock()
        if REWARD_KEY not in metrics and any(k.startswith("val-core/") for k in metrics):
            self.console.print(validation_line(metrics, step, self.total), markup=False)
        else:
            self.durations = (self.durations + [now - self.last])[-self.WINDOW:]
            pace = sum(self.durations) / len(self.durations)
            self.console.print(step_line(metrics, step, self.total, pace), markup=False)
        self.last = now

    def close(self) -> None:
        return None


# logger -> (the module its sink imports, the extra that installs it)
_LOGGER_PACKAGES = {"tensorboard": ("tensorboard", "tensorboard"), "wandb": ("wandb", "wandb")}


def check_logger_packages(loggers: list[str], key: str = "trainer.logger") -> None:
    """Refuse (UserError) a logger whose package is not installed, before anything runs: the sink
    itself is only made once the run's workers are up, minutes into a pipeline."""
    import importlib.util

    for name in loggers:
        module, extra = _LOGGER_PACKAGES.get(name, (None, None))
        if module is not None and importlib.util.find_spec(module) is None:
            raise UserError(f"{key} includes {name!r} but it is not installed: pip install 'alignctl[{extra}]' "
                            f"(or drop it from {key})")


class TensorboardSink:
    def __init__(self, folder: Path) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            raise UserError("trainer.logger includes 'tensorboard' but it is not installed: "
                            "pip install 'alignctl[tensorboard]'") from None
        self.writer = SummaryWriter(str(folder))

    def log(self, metrics: dict[str, float], step: int) -> None:
        for key, value in metrics.items():
            self.writer.add_scalar(key, value, step)

    def close(self) -> None:
        self.writer.close()


class WandbSink:
    """A wandb run whose local files live in the run folder (``<run>/wandb``), not in the current
    folder; ``WANDB_MODE=offline`` keeps everything local (``wandb sync`` uploads it later)."""

    def __init__(self, folder: Path, project: str, name: str, config: dict[str, Any]) -> None:
        try:
            import wandb
        except ImportError:
            raise UserError("trainer.logger includes 'wandb' but it is not installed: pip install 'alignctl[wandb]'") from None
        folder.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=project, name=name, config=config, dir=str(folder))

    def log(self, metrics: dict[str, float], step: int) -> None:
        self.run.log(metrics, step=step)

    def close(self) -> None:
        self.run.finish()


class Tracker:
    def __init__(self, sinks: list[Sink]) -> None:
        self.sinks = sinks

    @classmethod
    def create(cls, loggers: list[str], run_dir: Path, *, project: str, name: str,
               config: dict[str, Any], resume: bool = False, total_steps: int | None = None) -> Tracker:
        known = {"console", "jsonl", "tensorboard", "wandb"}
        unknown = [x for x in loggers if x not in known]
        if unknown:
            raise UserError(f"trainer.logger: unknown logger(s) {unknown}; expected any of {sorted(known)}")
        sinks: list[Sink] = [JsonlSink(run_dir / "metrics.jsonl", append=resume)]  # always
        if "console" in loggers:
            sinks.append(ConsoleSink() if os.environ.get(VERBOSE_ENV) else StepLineSink(total_steps))
        if "tensorboard" in loggers:
            sinks.append(TensorboardSink(run_dir / "tensorboard"))
        if "wandb" in loggers:
            sinks.append(WandbSink(run_dir, project, name, config))
        return cls(sinks)

    def log(self, metrics: dict[str, float], step: int) -> None:
        for sink in self.sinks:
            sink.log(metrics, step)

    def close(self) -> None:
        for sink in self.sinks:
            sink.close()
