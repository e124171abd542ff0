"""Float64 reference of the rope stage's public API (maintainer-owned).

The oracle's reference worker loads this file in place of
``niels_gpt.model.rope`` for the calls ``reference_calls`` of
``specs/rope.toml`` names (and for every call of a first PR of the stage).
It is written from the spec (its invariants ``cache_values``,
``matches_complex_reference``, ``cache_slicing``, ``autocast_neutral``) and
from seed 003's formulas, not from the implementation:

- ``rope_cache``: frequency ``i`` of ``D // 2`` is ``theta ** (-2 i / D)``, the
  angle at position ``p`` is ``p`` times it, the tables are its sine and
  cosine, shaped ``(1, 1, T, D // 2)``, float32 on the CPU unless a dtype or
  device is asked for. Exponent, frequency, angle and sine are each one
  float64 operation, in the order the formula reads; only the finished
  tables are rounded to the asked dtype. (At large positions a float64
  table's sine is only as good as the angle's float64 rounding, so the angle
  is formed exactly as the formula reads, not by some other route.)
- ``apply_rope``: channel pairs ``(2i, 2i+1)`` read as ``(a, b)`` turn to
  ``(a cos - b sin, a sin + b cos)`` with the tables' first ``Tq`` rows;
  computed in float64 from the given q, k and tables (whatever their dtype,
  inside or outside autocast), rounded back to q's dtype. Differentiable in
  q, k, sin and cos to every order.

Bad input raises ``RopeInputError`` (an ``AssertionError`` and a
``ValueError``, one type for both functions, as the spec asks). The spec does
not name the type, and the oracle compares exception names, so the bad-input
calls are not among ``reference_calls``: the base judges those.
"""

from __future__ import annotations

import math

import torch

# The worker registers this file under its module name without importing the
# parent packages; importing them here lets ``import niels_gpt.model.rope as rope``
# (the driver's form) resolve the name through them.
import niels_gpt.model  # noqa: F401

__all__ = ["apply_rope", "rope_cache"]


class RopeInputError(AssertionError, ValueError):
    """The one error both functions raise for input outside the spec."""


def _positive_int(name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise RopeInputError(f"{name} must be an int >= 1, got {value!r}")
    return value


def rope_cache(
    T: int,
    D: int,
    *,
    theta: float = 10000.0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(sin, cos)``, each ``(1, 1, T, D // 2)``: the spec's tables, rounded to ``dtype``.

    Raises:
        RopeInputError: ``T`` or ``D`` not a positive int, ``D`` odd, ``theta``
            not a finite positive number, ``dtype`` not a floating dtype.
    """
    _positive_int("T", T)
    _positive_int("D", D)
    if D % 2:
        raise RopeInputError(f"D must be even, got {D}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise RopeInputError(f"theta must be a number, got {type(theta).__name__}")
    if not (math.isfinite(theta) and theta > 0):
        raise RopeInputError(f"theta must be finite and > 0, got {theta!r}")
    want = torch.float32 if dtype is None else dtype
    if not isinstance(want, torch.dtype) or not want.is_floating_point:
        raise RopeInputError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    where = torch.device("cpu") if device is None else torch.device(device)
    i = torch.arange(D // 2, dtype=torch.float64)  # (D/2,)
    freq = float(theta) ** (-2.0 * i / D)  # (D/2,)
    pos = torch.arange(T, dtype=torch.float64)  # (T,)
    angle = pos[:, None] * freq[None, :]  # (T, D/2)
    sin = angle.sin().to(device=where, dtype=want)  # (T, D/2)
    cos = angle.cos().to(device=where, dtype=want)  # (T, D/2)
    return sin.reshape(1, 1, T, D // 2), cos.reshape(1, 1, T, D // 2)  # (1, 1, T, D/2) each


def _check(q: object, k: object, sin: object, cos: object) -> None:
    """Every condition the spec lists for ``apply_rope``; nothing is cast to fit."""
    for name, t in (("q", q), ("k", k), ("sin", sin), ("cos", cos)):
        if not isinstance(t, torch.Tensor):
            raise RopeInputError(f"{name} must be a tensor, got {type(t).__name__}")
    assert isinstance(q, torch.Tensor) and isinstance(k, torch.Tensor)
    assert isinstance(sin, torch.Tensor) and isinstance(cos, torch.Tensor)
    if q.ndim != 4 or q.shape != k.shape:
        raise RopeInputError(f"q and k must be one (B, H, Tq, D) shape: {q.shape}, {k.shape}")
    if not q.dtype.is_floating_point or (k.dtype, k.device) != (q.dtype, q.device):
        raise RopeInputError(
            f"q and k must share one floating dtype and device: {q.dtype}, {k.dtype}"
        )
    d = q.shape[-1]
    if d % 2:
        raise RopeInputError(f"the head dim must be even, got {d}")
    if sin.shape != cos.shape or sin.ndim != 4 or sin.shape[:2] != (1, 1):
        raise RopeInputError(
            f"sin and cos must be one (1, 1, Tc, D/2) shape: {sin.shape}, {cos.shape}"
        )
    if sin.shape[-1] != d // 2:
        raise RopeInputError(f"the tables' last dim must be {d // 2}, got {sin.shape[-1]}")
    for table in (sin, cos):
        if (table.dtype, table.device) != (q.dtype, q.device):
            raise RopeInputError(f"the tables must be {q.dtype} on {q.device}, got {table.dtype}")
    if sin.shape[-2] < q.shape[-2]:
        raise RopeInputError(f"the tables hold {sin.shape[-2]} positions, q has {q.shape[-2]}")


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q_rot, k_rot)``: q and k ``(B, H, Tq, D)`` turned pair by pair, in q's dtype.

    Raises:
        RopeInputError: any condition of the spec broken (ranks, shapes, even
            ``D``, the tables' shape, dtype, device or length).
    """
    _check(q, k, sin, cos)
    t = q.shape[-2]
    with torch.autocast("cpu", enabled=False):
        s = sin[:, :, :t].double()  # (1, 1, Tq, D/2)
        c = cos[:, :, :t].double()  # (1, 1, Tq, D/2)

        def turn(x: torch.Tensor) -> torch.Tensor:
            a, b = x.double()[..., 0::2], x.double()[..., 1::2]  # (B, H, Tq, D/2) each
            pairs = torch.stack((a * c - b * s, a * s + b * c), dim=-1)  # (B, H, Tq, D/2, 2)
            return pairs.flatten(-2).to(x.dtype)  # (B, H, Tq, D)

        return turn(q), turn(k)
