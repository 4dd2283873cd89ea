"""Moving Batches between the controller (CPU) and a worker's device; the LM head kept in float32 under
autocast (``autocast`` itself is :func:`alignctl.device.autocast`, re-exported for the workers)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from alignctl.batch import Batch
from alignctl.device import autocast, torch_device_type

__all__ = ["autocast", "float32_output_head", "on_worker_device"]

F = TypeVar("F", bound=Callable[..., Any])


def on_worker_device(method: F) -> F:
    """Run a role method on the worker's device: the incoming Batch moves there (a no-op on CPU)
    and a returned Batch comes back to the CPU, which is what Ray ships to the controller."""

    @functools.wraps(method)
    def wrapper(self: Any, batch: Batch, *args: Any, **kwargs: Any) -> Any:
        out = method(self, batch.to(self.ctx.device), *args, **kwargs)
        return out.to("cpu") if isinstance(out, Batch) else out

    return wrapper  # type: ignore[return-value]


def float32_output_head(model: Any, device: str) -> None:
    """Run ``model``'s output projection (the LM head) in float32 even under bf16 autocast.

    The logits feed the sampler and every log-prob; bf16 logits (8 bits of mantissa, ~0.06 of
    rounding at |logit| 16) perturb both, and RL is sensitive to that where SFT is not. The head is
    patched on the instance, so parameter names, tied weights and saved folders are unchanged."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is None or getattr(head, "_alignctl_fp32", False):
        return
    plain = head.forward
    device_type = torch_device_type(device)

    def forward(hidden: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device_type=device_type, enabled=False):
            return plain(hidden.to(head.weight.dtype))

    head.forward = forward
    head._alignctl_fp32 = True
