"""How far two answers of one call may differ: bounds derived from the dtype.

The derivation follows the repository's test bound (root ``conftest.py``):
rounding to a floating dtype moves a value by at most ``u = eps / 2`` of its
size (round to nearest, ``eps = finfo(dtype).eps``). One *stage* (a matmul, a
reduction) rounds its operands and its result (``3u``) and accumulates a sum
of ``n`` terms, each addition rounding once in the accumulation dtype
(``n * u_acc``; 16-bit products accumulate in float32 on every backend torch
uses, float32 in float32, float64 in float64). To first order the stages'
errors add, so an output that went through ``stages`` stages, with ``n`` the
longest sum on the way (the driver says both, per call), satisfies
elementwise::

    |got - exact| <= rtol * (|exact| + terms),   rtol = stages * (3u + n * u_acc)

where ``u`` is that of the narrowest dtype the arithmetic ran in (bfloat16
autocast returns float32 probabilities computed from bfloat16 products) and
``terms`` stands for the size of the terms the element was summed from;
as in the tests, the largest ``|value|`` of the reference tensor. Two
implementations that each meet the bound differ by at most twice it, so:

- PR against base (same dtype, neither exact): ``allowed = 2 rtol (|base| + terms)``;
- PR against a float64 reference (exact but for its own float64 rounding and
  the final rounding to the output dtype): ``allowed = (rtol + rtol64 + u)(|ref| + terms)``;
- one implementation against itself (an invariant between two calls, e.g. the
  prefix before and after the future changed): ``2 rtol``, as PR against base.

Worst-case rounding grows with ``n``: in float32 at ``n = 1024`` the bound
is about 1e-3 of the largest value, enough to hide a causal leak diluted over
hundreds of positions. The drivers therefore make their wide sweeps in
float64 too, where the same leak stands ten orders of magnitude out.

Integer and boolean outputs (token ids, masks) must be equal. NaN must meet
NaN and an infinity the same infinity. Worked values (attention, 4 stages,
n = 1024): float32 ``rtol = 4 * 1027 * 2**-24 = 2.4e-4``; float64 ``4.6e-13``;
bfloat16 under autocast ``4 * (3 * 2**-8 + 1024 * 2**-24) = 0.047``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

EPS = {
    "float64": 2.0**-52,
    "float32": 2.0**-23,
    "bfloat16": 2.0**-7,
    "float16": 2.0**-10,
}
EXACT = frozenset({"int64", "int32", "int16", "int8", "uint8", "bool"})


def unit(dtype: str) -> float:
    """``u = eps / 2`` of a floating dtype named as torch names it (``float32``)."""
    return EPS[dtype] / 2


def rtol(dtype: str, stages: int, reduction: int) -> float:
    """``stages * (3u + reduction * u_acc)`` (see the module docstring)."""
    acc = unit("float64") if dtype == "float64" else unit("float32")
    return stages * (3 * unit(dtype) + reduction * acc)


def widest_error(dtype: str, computes_in: str | None) -> str:
    """The dtype whose rounding bounds an output: its own, or a narrower one it was computed in."""
    if computes_in is None or computes_in not in EPS or dtype not in EPS:
        return dtype
    return computes_in if EPS[computes_in] > EPS[dtype] else dtype


@dataclass(frozen=True)
class Deviation:
    """Where two tensors differ most beyond the bound (``None`` fields: shapes or dtypes)."""

    text: str


def _where(index: int, shape: tuple[int, ...]) -> str:
    return str(tuple(int(i) for i in np.unravel_index(index, shape))) if shape else "()"


def compare(
    got: np.ndarray[Any, Any],
    want: np.ndarray[Any, Any],
    dtype: str,
    *,
    stages: int,
    reduction: int,
    exact_reference: bool = False,
    computes_in: str | None = None,
) -> Deviation | None:
    """``None`` when ``got`` is within the bound of ``want``, else where and by how much."""
    if got.shape != want.shape:
        return Deviation(f"shape {got.shape} where {want.shape} was expected")
    if dtype in EXACT or dtype not in EPS:
        bad = got != want
        if not bool(bad.any()):
            return None
        first = int(np.argmax(bad.reshape(-1)))
        return Deviation(
            f"{int(bad.sum())} of {bad.size} values differ, first at "
            f"{_where(first, bad.shape)}: {got.reshape(-1)[first].item()!r} "
            f"where {want.reshape(-1)[first].item()!r} was expected"
        )
    g, w = got.astype(np.float64), want.astype(np.float64)
    r = rtol(widest_error(dtype, computes_in), stages, reduction)
    r = r + rtol("float64", stages, reduction) + unit(dtype) if exact_reference else 2 * r
    finite = np.isfinite(w)
    terms = float(np.abs(w[finite]).max()) if bool(finite.any()) else 0.0
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(g - w)
        allowed = r * (np.abs(w) + terms)
        same_special = (~finite) & ((g == w) | (np.isnan(g) & np.isnan(w)))
        bad = ~((diff <= allowed) | same_special)
    if not bool(bad.any()):
        return None
    excess = np.where(bad, np.nan_to_num(diff - allowed, nan=np.inf, posinf=np.inf), -np.inf)
    worst = int(np.argmax(excess.reshape(-1)))
    return Deviation(
        f"{int(bad.sum())} of {bad.size} values beyond the {dtype} bound; largest "
        f"|diff| {diff.reshape(-1)[worst]:.3g} at {_where(worst, bad.shape)} > allowed "
        f"{allowed.reshape(-1)[worst]:.3g} (got {g.reshape(-1)[worst]:.6g}, expected "
        f"{w.reshape(-1)[worst]:.6g}; rtol {r:.3g} from {stages} stages, n = {reduction})"
    )


def zero(got: np.ndarray[Any, Any]) -> Deviation | None:
    """``None`` when every value is exactly 0."""
    bad = got != 0
    if not bool(bad.any()):
        return None
    return Deviation(f"{int(bad.sum())} of {bad.size} values are not 0")


def upper_zero(got: np.ndarray[Any, Any]) -> Deviation | None:
    """``None`` when every entry above the diagonal of the last two dims is exactly 0."""
    if got.ndim < 2:
        return Deviation(f"expected at least 2 dims, found shape {got.shape}")
    rows, cols = got.shape[-2:]
    mask = np.triu(np.ones((rows, cols), dtype=bool), k=1)
    above = got[..., mask]
    bad = above != 0
    if not bool(bad.any()):
        return None
    return Deviation(
        f"{int(bad.sum())} entries above the diagonal are not 0 (largest "
        f"{float(np.abs(above).max()):.3g})"
    )
