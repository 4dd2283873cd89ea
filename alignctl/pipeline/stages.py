"""Stage kinds: the typed schema of each, where its output folder goes, how to run it, and its
headline metrics. The pipeline runner only talks to stages through this table."""

from __future__ import annotations

import importlib
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alignctl.config.core import set_dotted


@dataclass(frozen=True)
class StageKind:
    schema: str  # "module:Class"
    output_key: str  # dotted config key that receives the artifact folder
    run: Callable[[Any], dict[str, Any]]  # typed config -> metrics
    version: int = 1  # bump when the stage's output format changes: invalidates cached artifacts
    # What the config does not say about the inputs (an installed package's version, a file's size
    # and time): part of the cache key, so a new version of them is not served from the cache.
    sources: Callable[[Any], dict[str, Any]] | None = None

    def schema_class(self) -> type:
        module, name = self.schema.split(":")
        return getattr(importlib.import_module(module), name)

    def with_output(self, config: dict[str, Any], folder: Path) -> dict[str, Any]:
        config = json.loads(json.dumps(config))  # deep copy of plain data
        set_dotted(config, self.output_key.split("."), str(folder))
        return config


def _preprocess(cfg: Any) -> dict[str, Any]:
    from alignctl.console import print_preprocess_report, progress_enabled
    from alignctl.data.preprocess import run_preprocess

    report = run_preprocess(cfg, progress=progress_enabled())
    print_preprocess_report(report)
    return {"rows": report.files, "dropped": report.dropped, "skipped": report.skipped}


def _init_model(cfg: Any) -> dict[str, Any]:
    from alignctl.models.tiny import init_model

    info = init_model(out=cfg.out, tokenizer_from=cfg.tokenizer_from, arch=cfg.arch, hidden=cfg.hidden,
                      layers=cfg.layers, heads=cfg.heads, intermediate=cfg.intermediate, vocab_size=cfg.vocab_size,
                      tokenizer_kind=cfg.tokenizer_kind, max_position_embeddings=cfg.max_position_embeddings,
                      seed=cfg.seed, overwrite=True)
    return {"num_parameters": info.num_parameters, "vocab_size": info.vocab_size}


def _import_model(cfg: Any) -> dict[str, Any]:
    from alignctl.models.gguf_import import import_gguf

    # overwrite=True: the runner has already cleared this artifact folder (only ever its own).
    return import_gguf(cfg.gguf, package=cfg.from_package, out=cfg.out, dtype=cfg.dtype, overwrite=True).metrics()


def _sft(cfg: Any) -> dict[str, Any]:
    from alignctl.console import progress_enabled
    from alignctl.trainers.sft_trainer import print_sft_report, run_sft

    result = run_sft(cfg, progress=progress_enabled())
    print_sft_report(result)
    return dict(result.metrics)


def _train_rm(cfg: Any) -> dict[str, Any]:
    from alignctl.console import progress_enabled
    from alignctl.trainers.rm_trainer import print_rm_report, run_train_rm

    result = run_train_rm(cfg, progress=progress_enabled())
    print_rm_report(result)
    return dict(result.metrics)


def _rl(cfg: Any) -> dict[str, Any]:
    from alignctl.pipeline.summary import read_run_digest
    from alignctl.trainers.rl_factory import create_trainer

    result = create_trainer(cfg).fit()
    metrics: dict[str, Any] = {"steps": result.steps}
    for row in result.val_history[:1] + result.val_history[-1:]:
        prefix = "before" if row is result.val_history[0] and row["step"] == 0 else "after"
        metrics.update({f"{prefix}/{k}": v for k, v in row.items() if k.startswith("val-core/")})
    if result.history:
        metrics.update({k: result.history[-1][k] for k in ("critic/score/mean", "actor/reference_kl")
                        if k in result.history[-1]})
    metrics.update(read_run_digest(Path(cfg.trainer.run_dir)))  # reward start -> end, alarms fired
    return metrics


def _eval(cfg: Any) -> dict[str, Any]:
    from alignctl.console import progress_enabled
    from alignctl.eval import print_eval_report, run_eval

    results = run_eval(cfg, progress=progress_enabled())
    print_eval_report(results)
    return results.headline()


def _gguf_sources(cfg: Any) -> dict[str, Any]:
    import importlib.metadata
    import os

    if cfg.from_package:
        try:
            return {"package": cfg.from_package, "version": importlib.metadata.version(cfg.from_package)}
        except importlib.metadata.PackageNotFoundError:
            return {"package": cfg.from_package, "version": None}  # the stage itself says it is missing
    try:
        stat = os.stat(cfg.gguf)
    except OSError:
        return {}
    return {"gguf_bytes": stat.st_size, "gguf_mtime_ns": stat.st_mtime_ns}


STAGE_KINDS: dict[str, StageKind] = {
    "preprocess": StageKind("alignctl.config.preprocess:PreprocessConfig", "out", _preprocess),
    "init-model": StageKind("alignctl.config.init_model:InitModelConfig", "out", _init_model),
    "import-model": StageKind("alignctl.config.import_model:ImportModelConfig", "out", _import_model,
                              sources=_gguf_sources),
    "sft": StageKind("alignctl.config.sft:SFTConfig", "output_dir", _sft),
    "train-rm": StageKind("alignctl.config.train_rm:RewardModelConfig", "output_dir", _train_rm),
    "ppo": StageKind("alignctl.config.rl:RLConfig", "trainer.run_dir", _rl),
    "grpo": StageKind("alignctl.config.rl:RLConfig", "trainer.run_dir", _rl),
    "eval": StageKind("alignctl.config.eval:EvalConfig", "out", _eval),
}

# The RL kinds differ only in their defaults (as `alignctl ppo` / `alignctl grpo`): the estimator, and
# for GRPO a group of 4 responses per prompt (its advantage compares a response with its group's others;
# the schema's rollout.n of 1 is PPO's).
KIND_DEFAULTS: dict[str, dict[str, Any]] = {
    "ppo": {"algorithm": {"adv_estimator": "gae"}},
    "grpo": {"algorithm": {"adv_estimator": "grpo"}, "actor_rollout_ref": {"rollout": {"n": 4}}},
}
