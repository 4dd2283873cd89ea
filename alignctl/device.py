"""Which device a stage runs on: the one rule behind every ``device: auto``.

``auto`` means ``cuda`` when this process sees a CUDA GPU and ``cpu`` otherwise; any other name is
kept as given. Used by the RL controller (``trainer.device``), ``alignctl plan``, eval and audit
(``device`` / ``--device``), the SFT and RM stages and the Python API. A leaf: it imports only
``errors`` (torch lazily), so config-level modules such as ``plan`` may use it.

``autocast`` is the one rule behind every ``precision: bf16`` of a forward pass (RL workers, eval's
reward-model scoring); ``bf16_if_native`` is the rule behind every ``bf16_if_native`` precision
(train-rm, SFT, eval's ``rm_precision``): bf16 only where the hardware multiplies bf16 natively.
(Moving tensors to a worker's device lives in ``workers/batch_transfer.py``.)
"""

from __future__ import annotations

import contextlib
from typing import Any

from alignctl.errors import UserError


def cuda_available() -> bool:
    """Whether this process sees a CUDA GPU (torch imported on first use)."""
    import torch

    return bool(torch.cuda.is_available())


def resolve_device(name: str = "auto", *, key: str | None = None) -> str:
    """``auto`` -> ``cuda`` if this process sees a CUDA GPU, else ``cpu``; other names unchanged.

    ``key`` names the setting the value came from, for a device this very process will use (eval,
    audit): a ``cuda`` name without CUDA here is then a one-line UserError naming it. Without
    ``key`` the name passes unchecked: the RL controller and ``plan`` decide for workers that may
    run on other machines of a Ray cluster, where the controller's own view of CUDA proves nothing.
    """
    if name == "auto":
        return "cuda" if cuda_available() else "cpu"
    if key is not None and name.startswith("cuda") and not cuda_available():
        raise UserError(f"{key} is {name!r} but CUDA is not available on this machine; use 'cpu' or 'auto'")
    return name


def torch_device_type(device: str) -> str:
    """torch.autocast's device_type of a device name ('cuda', 'cuda:1', 'cpu')."""
    return "cuda" if device.startswith("cuda") else "cpu"


def autocast(device: str, precision: str) -> contextlib.AbstractContextManager[Any]:
    """A ``precision`` setting as a context for forward passes: bf16 autocast, or nothing for fp32.

    Only forwards go under it (backward reuses the dtypes the forward chose, as torch advises);
    parameters and optimizer state keep their own dtype, so small updates are not rounded away."""
    if precision != "bf16":
        return contextlib.nullcontext()
    import torch

    return torch.autocast(device_type=torch_device_type(device), dtype=torch.bfloat16)


BF16_IF_NATIVE = "bf16_if_native"


def native_bf16(device: str) -> bool:
    """Whether ``device`` multiplies bf16 natively: a CUDA GPU that supports bf16, or a CPU with
    avx512_bf16 or AMX tiles. Elsewhere torch emulates bf16 matmuls, and bf16 autocast is slower than
    float32: on a 2-core AMD EPYC with AVX2 only, train-rm's SmolLM2 steps took 11x as long and its
    validation 5x (docs/results.md "bf16 on a CPU")."""
    import torch

    if device.startswith("cuda"):
        return bool(torch.cuda.is_available() and torch.cuda.is_bf16_supported())
    probes = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")  # torch.cpu's own CPUID probes
    return any(bool(getattr(torch.cpu, name, lambda: False)()) for name in probes)


def bf16_if_native(precision: str, device: str, *, fallback: str = "fp32") -> str:
    """``bf16_if_native`` -> ``bf16`` where ``device`` has native bf16 (:func:`native_bf16`), else
    ``fallback`` (the setting's own name for full precision); other values unchanged."""
    if precision != BF16_IF_NATIVE:
        return precision
    return "bf16" if native_bf16(device) else fallback
