"""KL coefficient controllers (config: ``algorithm.kl_ctrl.type/kl_coef/target_kl/horizon``).

Notation:
    beta: current coefficient (``value``), KL_target: target_kl, H: horizon,
    KL: the batch's measured KL, n: samples (responses) in the step

    fixed:     beta stays kl_coef
    adaptive:  (Ziegler et al. 2019, arXiv:1909.08593)
               e = clip(KL / KL_target - 1, -0.2, 0.2)
               beta <- beta * (1 + e * n / H)

The controllers hold plain Python floats: ``update`` is called by the controller process with
an already-fetched KL value, so nothing here touches devices.
"""

from __future__ import annotations

from typing import Any

__all__ = ["FixedKLController", "AdaptiveKLController", "KL_CTRL_TYPES", "make_kl_controller"]

KL_CTRL_TYPES: tuple[str, ...] = ("fixed", "adaptive")


class FixedKLController:
    """Constant coefficient; ``update`` is a no-op."""

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op: the coefficient is fixed."""

    def state_dict(self) -> dict[str, Any]:
        return {"type": "fixed", "value": self.value}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_type(state, "fixed")
        self.value = float(state["value"])


class AdaptiveKLController:
    """Proportional controller steering the measured KL towards ``target_kl``."""

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if target_kl <= 0:
            raise ValueError(f"adaptive KL controller needs target_kl > 0, got {target_kl}")
        if horizon <= 0:
            raise ValueError(f"adaptive KL controller needs horizon > 0, got {horizon}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Scale ``value`` by ``1 + clip(KL/target - 1, -0.2, 0.2) * n_steps / horizon``."""
        error = min(max(current_kl / self.target - 1.0, -0.2), 0.2)
        self.value *= 1.0 + error * n_steps / self.horizon

    def state_dict(self) -> dict[str, Any]:
        return {"type": "adaptive", "value": self.value, "target": self.target, "horizon": self.horizon}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        _check_type(state, "adaptive")
        self.value = float(state["value"])
        self.target = float(state["target"])
        self.horizon = float(state["horizon"])


KLController = FixedKLController | AdaptiveKLController


def _check_type(state: dict[str, Any], expected: str) -> None:
    if state.get("type") != expected:
        raise ValueError(f"KL controller state is for type {state.get('type')!r}, expected {expected!r}")


def make_kl_controller(
    kind: str, *, kl_coef: float, target_kl: float | None = None, horizon: float | None = None
) -> KLController:
    """Build a controller from plain values (the caller unpacks ``algorithm.kl_ctrl``)."""
    if kind == "fixed":
        return FixedKLController(kl_coef)
    if kind == "adaptive":
        if target_kl is None or horizon is None:
            raise ValueError("adaptive KL controller needs target_kl and horizon")
        return AdaptiveKLController(kl_coef, target_kl, horizon)
    raise ValueError(f"unknown KL controller type {kind!r}; valid types: {', '.join(KL_CTRL_TYPES)}")
