"""The advantage-estimator registry (config: ``algorithm.adv_estimator``) and ``compute_advantage``.

Each entry is an :class:`Estimator`: a function ``fn(data, config) -> (advantages [B, T], returns
[B, T])`` plus what it needs from the loop, declared once here and read by config validation and
by the loop (nothing else knows estimators by name):

- ``critic``: a value model runs and ``data["values"]`` [B, T] holds its predictions;
- ``min_group_size``: the responses per prompt (``actor_rollout_ref.rollout.n``) it compares;
- ``extra_rollouts``: named extra rollouts the loop runs and unions into ``data`` before the
  reward is scored (``greedy_baseline`` gives ReMax its ``baseline_rewards``; see
  :mod:`alignctl.trainers.extra_rollouts`);
- ``options``: the estimator's own hyperparameters with their defaults; a user sets them under
  ``algorithm.estimator_kwargs`` (an unknown key there is a config error) and the function reads
  ``config.estimator_kwargs[name]``, filled with the defaults.

``data`` is the step's Batch: ``token_level_rewards`` and ``response_mask`` [B, T], ``group_index``
[B] (the prompt of each response), plus whatever the needs above add. ``config`` is the
``algorithm`` section (``AlgorithmConfig``: ``gamma``, ``lam``, ``norm_adv_by_std_in_grpo``,
``estimator_kwargs``, ...). The math of the built-ins is in :mod:`alignctl.algos.advantages`;
the entries here only unpack ``data`` and ``config`` for it.

This module imports no config (config validation imports it), so ``config`` is typed ``Any``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from alignctl.algos import advantages as adv_math
from alignctl.registries import Registry
from alignctl.batch import Batch
from alignctl.trainers.extra_rollouts import EXTRA_ROLLOUTS

__all__ = ["ADV_ESTIMATORS", "Estimator", "EstimatorFn", "compute_advantage", "get_adv_estimator",
           "register_adv_estimator", "resolve_estimator_kwargs"]

EstimatorFn = Callable[[Batch, Any], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class Estimator:
    """A registered estimator and what it needs from the loop (see the module docstring)."""

    name: str
    fn: EstimatorFn
    critic: bool = False
    min_group_size: int = 1
    extra_rollouts: tuple[str, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)

    def __call__(self, data: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return self.fn(data, config)


ADV_ESTIMATORS: Registry[Estimator] = Registry("advantage estimator")


def register_adv_estimator(name: str, *, critic: bool = False, min_group_size: int = 1,
                           extra_rollouts: tuple[str, ...] = (),
                           options: Mapping[str, Any] | None = None) -> Callable[[EstimatorFn], EstimatorFn]:
    """Decorator registering ``fn(data, config)`` as ``algorithm.adv_estimator=name`` with its needs.

    An extra rollout must be registered already (a typo fails at import, not at step 1)."""
    for extra in extra_rollouts:
        EXTRA_ROLLOUTS.get(extra)  # ValueError listing the known extra rollouts
    if min_group_size < 1:
        raise ValueError(f"advantage estimator {name!r}: min_group_size must be >= 1, got {min_group_size}")

    def decorator(fn: EstimatorFn) -> EstimatorFn:
        existing = ADV_ESTIMATORS.get(name).fn if name in ADV_ESTIMATORS else None
        if existing is not fn:  # importing the same plugin twice registers the same function: no error
            ADV_ESTIMATORS.register(name)(Estimator(name, fn, critic, min_group_size, tuple(extra_rollouts),
                                                    dict(options or {})))
        return fn

    return decorator


def get_adv_estimator(name: str) -> Estimator:
    """The entry registered as ``name``; ``ValueError`` listing the valid names otherwise."""
    return ADV_ESTIMATORS.get(name)


def resolve_estimator_kwargs(name: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """``algorithm.estimator_kwargs`` for estimator ``name``: its declared defaults overridden by
    ``given``; ``ValueError`` naming a key the estimator does not declare."""
    options = get_adv_estimator(name).options
    unknown = sorted(set(given) - set(options))
    if unknown:
        known = ", ".join(sorted(options)) or "none"
        raise ValueError(f"advantage estimator {name!r} has no option {unknown[0]!r} (its options: {known})")
    return {**options, **given}


def compute_advantage(batch: Batch, algorithm: Any) -> Batch:
    """Advantages and returns [N, T] by the configured estimator (``algorithm.adv_estimator``)."""
    estimator = get_adv_estimator(algorithm.adv_estimator)
    advantages, returns = estimator(batch, algorithm)
    return Batch({"advantages": advantages, "returns": returns})


# ----------------------------------------------------------------------------- the built-ins


def _mask(data: Batch) -> torch.Tensor:
    return data["response_mask"].float()


@register_adv_estimator("gae", critic=True)
def _gae(data: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return adv_math.gae_advantages(data["token_level_rewards"], _mask(data), values=data["values"],
                                   gamma=config.gamma, lam=config.lam)


def _group_estimator(name: str, fn: Callable[..., tuple[torch.Tensor, torch.Tensor]], *, by_std: bool) -> None:
    """Register an estimator that compares the responses of one prompt (groups of n >= 2)."""

    def estimator(data: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
        extra = {"norm_adv_by_std": config.norm_adv_by_std_in_grpo} if by_std else {}
        return fn(data["token_level_rewards"], _mask(data), group_index=data["group_index"], **extra)

    register_adv_estimator(name, min_group_size=2)(estimator)


_group_estimator("grpo", adv_math.grpo_advantages, by_std=True)
_group_estimator("rloo", adv_math.rloo_advantages, by_std=False)
_group_estimator("opo", adv_math.opo_advantages, by_std=False)
_group_estimator("reinforce_plus_plus_baseline", adv_math.reinforce_plus_plus_baseline_advantages, by_std=False)
_group_estimator("grpo_passk", adv_math.grpo_passk_advantages, by_std=True)


@register_adv_estimator("reinforce_plus_plus")
def _reinforce_plus_plus(data: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return adv_math.reinforce_plus_plus_advantages(data["token_level_rewards"], _mask(data), gamma=config.gamma)


@register_adv_estimator("remax", extra_rollouts=("greedy_baseline",))
def _remax(data: Batch, config: Any) -> tuple[torch.Tensor, torch.Tensor]:
    return adv_math.remax_advantages(data["token_level_rewards"], _mask(data),
                                     baseline_rewards=data["baseline_rewards"], gamma=config.gamma)
