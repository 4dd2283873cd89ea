"""Metric sinks: console (a rich table per step), jsonl (always, in the run folder), tensorboard
and wandb (when their extras are installed). ``Tracker.log(metrics, step)`` fans out to all."""

from __future__ import annotations

import json
import math
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
               config: dict[str, Any], resume: bool = False) -> Tracker:
        known = {"console", "jsonl", "tensorboard", "wandb"}
        unknown = [x for x in loggers if x not in known]
        if unknown:
            raise UserError(f"trainer.logger: unknown logger(s) {unknown}; expected any of {sorted(known)}")
        sinks: list[Sink] = [JsonlSink(run_dir / "metrics.jsonl", append=resume)]  # always
        if "console" in loggers:
            sinks.append(ConsoleSink())
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
