"""Frozen models kept in CPU memory between their passes (``ref.fsdp_config.param_offload``,
``reward_model.model.fsdp_config.param_offload``) for modules that are not sharded.

A frozen model's weights never change, so the CPU copy is made once (pinned on CUDA, so the
host-to-device copy is fast and asynchronous) and parking is free: every parameter and buffer is
pointed back at its CPU copy and the device copy is dropped. Before a pass each tensor gets a fresh
device copy. Nothing is copied back, and nothing is written while the weights are on the device
(callers run no-grad forwards only). Tensors are swapped in place (``torch.utils.swap_tensors``),
so the module and anything holding its parameters see the move; an autograd graph still holding a
weight makes the swap refuse loudly instead of leaving a stale copy behind.

On a CPU worker the device copy *is* the CPU copy (``Tensor.to`` returns the same tensor), so
parking costs nothing and frees nothing. Sharded frozen models use their engine's own offload
instead (fsdp2: ``CPUOffloadPolicy``; ZeRO-3: DeepSpeed's ``offload_param``); see
``workers/model_setup.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn


class ParkedModule:
    """``module`` (frozen from here on) with its weights in CPU memory, on ``device`` only inside
    :meth:`on_device`."""

    def __init__(self, module: nn.Module, device: str | torch.device) -> None:
        self.module = module.requires_grad_(False)
        self.device = torch.device(device)
        pin = self.device.type == "cuda"
        # Parameters and buffers (rotary tables...) alike; tied weights are one parameter, visited once.
        self._tensors = [*module.parameters(), *module.buffers()]
        self._host = [_host_copy(t.detach(), pin) for t in self._tensors]
        self.park()

    def park(self) -> None:
        """Every tensor back on its CPU copy; the device copies are freed (no copy back: frozen)."""
        self._place(torch.device("cpu"))

    def load(self) -> None:
        """A device copy of every tensor (the CPU copies themselves on a CPU worker)."""
        self._place(self.device)

    def _place(self, device: torch.device) -> None:
        # swap_tensors keeps each tensor's identity (tied weights, references held by the module),
        # which ``.data =`` cannot do across device types such as meta.
        for tensor, host in zip(self._tensors, self._host):
            torch.utils.swap_tensors(tensor, _like(tensor, host.to(device, non_blocking=True)))

    @contextlib.contextmanager
    def on_device(self) -> Iterator[nn.Module]:
        self.load()
        try:
            yield self.module
        finally:
            self.park()


def _host_copy(tensor: torch.Tensor, pin: bool) -> torch.Tensor:
    """The CPU copy (a CPU tensor shares its storage: nothing is duplicated on a CPU worker)."""
    host = tensor.to("cpu")
    return host.pin_memory() if pin else host


def _like(template: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """A new tensor object over ``value``'s storage, of ``template``'s kind (swap_tensors needs a
    distinct object; ``Tensor.to`` may return the CPU copy itself, which must stay in the list)."""
    if isinstance(template, nn.Parameter):
        return nn.Parameter(value, requires_grad=False)
    return value.detach()
