"""Name-keyed registries: config strings select functions, never ``if/elif`` chains in trainers.

A ``Registry`` behaves like a read-only collection of names (``"vanilla" in POLICY_LOSSES``,
``sorted(POLICY_LOSSES)``), so the list a config validator shows is always the live one,
including functions users register from their own code.

The registries: advantage estimators (``trainers/estimators.py``), extra rollouts
(``trainers/extra_rollouts.py``), policy losses (``algos/policy_loss.py``), reward managers
(``rewards/managers.py``), tools (``tools/tool.py``). This module is a leaf (it imports nothing
from alignctl and not torch), so the light packages (rewards, tools) use it too.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Registry"]

F = TypeVar("F", bound=Callable[..., object])


class Registry(Generic[F]):
    """Maps names to functions that share one signature.

    Args:
        kind: what the entries are, used in error messages (e.g. ``"advantage estimator"``).
    """

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._fns: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        """Decorator adding ``fn`` under ``name``; re-registering a different function is an error
        (two plugins silently shadowing each other is worse than failing at import)."""

        def decorator(fn: F) -> F:
            existing = self._fns.get(name)
            if existing is not None and existing is not fn:
                raise ValueError(f"{self.kind} {name!r} is already registered to {existing!r}")
            self._fns[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        """The function registered as ``name``; ``ValueError`` listing valid names otherwise."""
        try:
            return self._fns[name]
        except KeyError:
            valid = ", ".join(sorted(self._fns))
            raise ValueError(f"unknown {self.kind} {name!r}; valid names: {valid}") from None

    def unregister(self, name: str) -> None:
        """Remove ``name`` (plugins that unload, tests that register temporary entries)."""
        self.get(name)  # same error message for an unknown name
        del self._fns[name]

    def __contains__(self, name: object) -> bool:
        return name in self._fns

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self._fns))

    def __len__(self) -> int:
        return len(self._fns)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {sorted(self._fns)})"
