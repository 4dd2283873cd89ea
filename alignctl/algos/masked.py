"""Masked reductions shared by every estimator and loss.

Notation:
    B: batch size (number of responses)
    T: padded response length
    mask: 0/1 tensor (bool, int or float) broadcastable to ``values``; 1 marks a valid token.

Contracts (relied on by the tests of everything built on top):
    * values at masked positions never influence the result, even if they are NaN or inf:
      they are removed with ``torch.where`` rather than multiplied by zero;
    * an empty mask gives 0, never NaN (``safe_div`` returns 0 where the denominator is 0);
    * nothing here calls ``.item()`` or branches on tensor data, so it never forces a device sync.
"""

from __future__ import annotations

import torch

__all__ = [
    "safe_div",
    "masked_sum",
    "masked_count",
    "masked_mean",
    "masked_var",
    "masked_whiten",
]


def safe_div(num: torch.Tensor, den: torch.Tensor | float) -> torch.Tensor:
    """``num / den`` where ``den != 0``, else 0; gradients stay finite in both branches."""
    den_t = torch.as_tensor(den, dtype=num.dtype, device=num.device)
    nonzero = den_t != 0
    # Divide by 1 where den == 0 so the unused branch carries no inf/NaN into autograd.
    return torch.where(nonzero, num / torch.where(nonzero, den_t, torch.ones_like(den_t)), 0.0)


def _keep(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """``values`` with masked positions replaced by exact zeros."""
    return torch.where(mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device))


def masked_sum(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Sum of ``values`` over positions where ``mask`` is 1.

    Args:
        values: ``[...]`` any shape.
        mask: same shape as ``values`` (or broadcastable to it).
        dim: reduce this dimension only; ``None`` reduces everything to a scalar.
    """
    kept = _keep(values, mask)
    return kept.sum() if dim is None else kept.sum(dim=dim)


def masked_count(mask: torch.Tensor, like: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Number of valid positions, in ``like``'s dtype (so it can divide sums of ``like``)."""
    m = mask.bool().expand_as(like).to(like.dtype)
    return m.sum() if dim is None else m.sum(dim=dim)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over valid positions; 0 where there are none.

    Shapes: ``values [...]``, ``mask`` same -> scalar (``dim=None``) or ``values`` reduced over ``dim``.
    """
    return safe_div(masked_sum(values, mask, dim), masked_count(mask, values, dim))


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance over all valid positions (scalar).

    ``unbiased=True`` divides by ``n - 1`` (Bessel), as verl's ``masked_var`` does. With ``n <= 1``
    the unbiased variance is undefined; it is returned as 0 rather than NaN (no data-dependent
    raise, which would need a device sync).
    """
    mean = masked_mean(values, mask)
    sq_dev = masked_sum((values - mean) ** 2, mask)
    n = masked_count(mask, values)
    return safe_div(sq_dev, n - 1 if unbiased else n) * (n > (1 if unbiased else 0))


def masked_whiten(
    values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True, eps: float = 1e-8
) -> torch.Tensor:
    """Normalise valid positions to zero mean and unit (unbiased) variance over the whole tensor.

    ``out = (x - mean) / sqrt(var + eps)`` (``+ mean`` again when ``shift_mean=False``); masked
    positions are 0 in the output. All-equal values give 0, not NaN: ``0 / sqrt(eps)``.

    Shapes: ``values [B, T]``, ``mask [B, T]`` -> ``[B, T]``.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + eps)
    if not shift_mean:
        whitened = whitened + mean
    return _keep(whitened, mask)
