"""Moving Batches between the controller (CPU) and a worker's device."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from alignctl.batch import Batch

F = TypeVar("F", bound=Callable[..., Any])


def on_worker_device(method: F) -> F:
    """Run a role method on the worker's device: the incoming Batch moves there (a no-op on CPU)
    and a returned Batch comes back to the CPU, which is what Ray ships to the controller."""

    @functools.wraps(method)
    def wrapper(self: Any, batch: Batch, *args: Any, **kwargs: Any) -> Any:
        out = method(self, batch.to(self.ctx.device), *args, **kwargs)
        return out.to("cpu") if isinstance(out, Batch) else out

    return wrapper  # type: ignore[return-value]
