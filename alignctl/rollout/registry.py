"""The rollout-engine registry: each engine is one entry that names its class and declares what it
can do, so config validation, the actor and the memory planner ask the entry instead of testing
engine names.

A third engine (SGLang, or a user's) is one module with a :class:`RolloutEngine` subclass that has a
``from_setup(rollout_cfg, setup)`` classmethod, plus one :func:`register_rollout_engine` call (in a
module listed under ``algorithm.plugins`` or an ``alignctl.plugins`` entry point). Engine modules are
imported only when an engine is built, so ``import alignctl.rollout`` stays light and validation
never imports vLLM.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from alignctl.errors import UserError

if TYPE_CHECKING:
    from alignctl.rollout.engine import RolloutEngine, RolloutSetup


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine supports; every check outside the engine reads these flags.

    trainer_precision runs the trainer's torch module, so it follows trainer.precision (autocast)
    sleep             can release its memory between rollouts (else sleep/wake are no-ops, reported)
    multi_turn        token-in / token-out generation that MultiTurnRollout can drive turn by turn
    log_probs         returns the sampling log-probs of the chosen tokens
    lora              generates with LoRA-trained weights (adapters merged before each sync)
    dtype_copy        honours rollout.dtype (a low-precision copy built by the actor)
    device_fraction   reserves rollout.gpu_memory_utilization of the device (the memory planner counts it)
    """

    trainer_precision: bool = False
    sleep: bool = False
    multi_turn: bool = True
    log_probs: bool = True
    lora: bool = True
    dtype_copy: bool = False
    device_fraction: bool = False


@dataclass(frozen=True)
class EngineEntry:
    name: str
    target: str  # "package.module:Class", imported on first build
    capabilities: EngineCapabilities
    install_hint: str = ""  # how to get what the engine needs, shown when its import fails
    summary: str = ""

    def load_class(self) -> type[RolloutEngine]:
        module_name, _, cls_name = self.target.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as exc:
            hint = f"; {self.install_hint}" if self.install_hint else ""
            raise UserError(f"rollout engine {self.name!r} could not be imported ({exc}){hint}") from exc
        cls: type[RolloutEngine] = getattr(module, cls_name)
        return cls


ROLLOUT_ENGINES: dict[str, EngineEntry] = {}


def register_rollout_engine(entry: EngineEntry, *, replace: bool = False) -> EngineEntry:
    """Add an engine under ``entry.name`` (a second registration of a name is an error unless ``replace``)."""
    if entry.name in ROLLOUT_ENGINES and not replace and ROLLOUT_ENGINES[entry.name] != entry:
        raise ValueError(f"rollout engine {entry.name!r} is already registered")
    ROLLOUT_ENGINES[entry.name] = entry
    return entry


def engine_entry(name: str, key: str = "actor_rollout_ref.rollout.name") -> EngineEntry:
    """The registered entry of ``name``; a one-line UserError naming ``key`` when there is none."""
    if name not in ROLLOUT_ENGINES:
        raise UserError(f"key '{key}': unknown rollout engine {name!r}; expected one of: "
                        f"{', '.join(sorted(ROLLOUT_ENGINES))} (or register one: docs/customize.md)")
    return ROLLOUT_ENGINES[name]


def build_rollout_engine(rollout_cfg: Any, setup: RolloutSetup) -> RolloutEngine:
    """The engine ``rollout_cfg.name`` built from the rollout config and the actor's setup."""
    return engine_entry(rollout_cfg.name).load_class().from_setup(rollout_cfg, setup)


register_rollout_engine(EngineEntry(
    "hf", "alignctl.rollout.hf_engine:HFRolloutEngine",
    EngineCapabilities(trainer_precision=True, sleep=True, dtype_copy=True),
    summary="in-process generation with the training module itself (KV cache, shared prefill)"))
register_rollout_engine(EngineEntry(
    "vllm", "alignctl.rollout.vllm_engine:VLLMRolloutEngine",
    EngineCapabilities(sleep=True, device_fraction=True),
    install_hint="GPU: pip install 'alignctl[vllm]'; CPU: bash scripts/setup.sh --with-vllm (docs/gpu_and_cluster.md)",
    summary="vLLM in the actor process (its own weight copy, synced and verified after every update)"))
