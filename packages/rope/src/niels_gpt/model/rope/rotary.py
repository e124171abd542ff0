"""Rotary position embeddings (RoPE): a sin/cos cache and its application.

Channels are rotated in interleaved pairs ``(x[2i], x[2i+1])`` (the "GPT-J" or
even/odd layout), not in two halves. For pair ``i`` at position ``p``::

    inv_freq[i] = theta ** (-2 i / D)
    angle[p, i] = p * inv_freq[i]
    a' = a cos(angle) - b sin(angle)
    b' = a sin(angle) + b cos(angle)

Shape notation::

    B: batch, H: heads, Tq: query length, Tcache: cache length, D: head dim

Two ways to the same rotation: where a pair can be read in place as a
complex number (float32/float64, eager, off MPS) one complex multiply does it;
elsewhere (MPS, half precision, misaligned views, compiled graphs) real
arithmetic does. Both are checked against an independent float64
complex-number formulation
(``x_pair * exp(i angle)``) in ``tests/test_rope_properties.py``.
"""

from __future__ import annotations

import math

import torch

__all__ = ["apply_rope", "rope_cache"]


class _RopeInputError(AssertionError, ValueError, TypeError):
    """The one exception type both RoPE functions raise for a broken invariant.

    Raised explicitly (never by ``assert``) so it survives ``python -O``; it is
    an ``AssertionError`` and a ``ValueError`` as the spec allows either.
    """


def _fail(message: str) -> _RopeInputError:
    return _RopeInputError(message)


def rope_cache(
    T: int,
    D: int,
    *,
    theta: float = 10000.0,
    device: str | torch.device | None = None,
    dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Build the RoPE sin/cos tables for positions ``0..T-1``.

    Angles are computed in float64 on the CPU whatever ``dtype`` is asked for;
    only the finished sin/cos are cast and moved, so a float16 or float32
    cache is the correctly rounded value of the exact one.

    Args:
        T: number of positions, ``>= 1``.
        D: head dim, positive and even.
        theta: frequency base, finite and positive.
        device: where the tables live; CPU when ``None``.
        dtype: floating dtype of the tables; float32 when ``None``.

    Returns:
        ``(sin, cos)``, each of shape ``(1, 1, T, D // 2)``.

    Raises:
        AssertionError/ValueError (one type): any argument out of range, odd
            ``D``, or a non-floating ``dtype``.
    """
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise _fail(f"rope_cache: T must be an int >= 1, got {T!r}")
    if isinstance(D, bool) or not isinstance(D, int) or D < 2:
        raise _fail(f"rope_cache: D must be a positive even int, got {D!r}")
    if D % 2 != 0:
        raise _fail(f"rope_cache: D must be even (channels rotate in pairs), got D={D}")
    if isinstance(theta, bool) or not isinstance(theta, (int, float)):
        raise _fail(f"rope_cache: theta must be a float, got {type(theta).__name__} {theta!r}")
    if not (math.isfinite(theta) and theta > 0):
        raise _fail(f"rope_cache: theta must be finite and > 0, got {theta!r}")
    out_dtype = torch.float32 if dtype is None else dtype
    if not isinstance(out_dtype, torch.dtype) or not out_dtype.is_floating_point:
        raise _fail(f"rope_cache: dtype must be a floating torch.dtype, got {dtype!r}")
    out_device = torch.device("cpu") if device is None else torch.device(device)

    half = D // 2
    i = torch.arange(half, dtype=torch.float64)  # (D/2,)
    inv_freq = torch.pow(float(theta), -2.0 * i / D)  # (D/2,)
    pos = torch.arange(T, dtype=torch.float64)  # (T,)
    angles = torch.outer(pos, inv_freq)  # (T, D/2)
    sin = angles.sin().to(device=out_device, dtype=out_dtype)  # (T, D/2)
    cos = angles.cos().to(device=out_device, dtype=out_dtype)  # (T, D/2)
    return sin.view(1, 1, T, half), cos.view(1, 1, T, half)  # (1, 1, T, D/2) each


def _check_apply_inputs(
    q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor
) -> None:
    for name, t in (("q", q), ("k", k), ("sin", sin), ("cos", cos)):
        if not isinstance(t, torch.Tensor):
            raise _fail(f"apply_rope: {name} must be a torch.Tensor, got {type(t).__name__}")
    if q.ndim != 4:
        raise _fail(f"apply_rope: q must be 4-D (B, H, Tq, D), got shape {tuple(q.shape)}")
    if q.shape != k.shape:
        raise _fail(
            f"apply_rope: q and k shapes must match, got q {tuple(q.shape)}, k {tuple(k.shape)}"
        )
    if not q.dtype.is_floating_point:
        raise _fail(f"apply_rope: q must be floating point, got {q.dtype}")
    if k.dtype != q.dtype or k.device != q.device:
        raise _fail(
            f"apply_rope: k must match q's dtype/device ({q.dtype}, {q.device}), "
            f"got ({k.dtype}, {k.device})"
        )
    d = q.shape[-1]
    if d % 2 != 0:
        raise _fail(f"apply_rope: head dim D must be even, got D={d}")
    if sin.shape != cos.shape:
        raise _fail(
            f"apply_rope: sin and cos shapes must match, got sin {tuple(sin.shape)}, "
            f"cos {tuple(cos.shape)}"
        )
    if sin.ndim != 4 or sin.shape[:2] != (1, 1):
        raise _fail(
            f"apply_rope: sin/cos must have shape (1, 1, Tcache, D//2), got {tuple(sin.shape)}"
        )
    if sin.shape[-1] != d // 2:
        raise _fail(f"apply_rope: sin/cos last dim must be D//2 = {d // 2}, got {sin.shape[-1]}")
    for name, table in (("sin", sin), ("cos", cos)):
        if table.dtype != q.dtype:
            raise _fail(
                f"apply_rope: {name}.dtype must equal q.dtype ({q.dtype}), got {table.dtype}"
            )
        if table.device != q.device:
            raise _fail(
                f"apply_rope: {name}.device must equal q.device ({q.device}), got {table.device}"
            )
    if sin.shape[-2] < q.shape[-2]:
        raise _fail(f"apply_rope: cache too short: Tcache={sin.shape[-2]} < Tq={q.shape[-2]}")


def _pair_tables(sin: torch.Tensor, cos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Spread the ``(1, 1, Tq, D/2)`` tables over all ``D`` channels.

    ``cos2[..., 2i] = cos2[..., 2i+1] = cos[..., i]`` and ``sin2 = (-sin, +sin)``
    per pair, so the rotation becomes ``x * cos2 + swap(x) * sin2`` with full-width
    contiguous operands. The tables are tiny next to ``q``/``k`` (no batch or
    head dims) and keep the dtype and device of ``sin``/``cos``.
    """
    cos2 = torch.stack((cos, cos), dim=-1).flatten(-2)  # (1, 1, Tq, D)
    sin2 = torch.stack((-sin, sin), dim=-1).flatten(-2)  # (1, 1, Tq, D)
    return sin2, cos2


def _rotate(x: torch.Tensor, sin2: torch.Tensor, cos2: torch.Tensor) -> torch.Tensor:
    # One new buffer per call, filled with swap(x): [x1, x0, x3, x2, ...]. Two strided
    # half-copies are far cheaper than stacking (..., D/2, 2) pairs, whose inner loop
    # has length 2. The rotation then runs in place on that contiguous buffer:
    #   even channel: b*(-sin) + a*cos;  odd channel: a*sin + b*cos.
    out = torch.empty_like(x, memory_format=torch.contiguous_format)  # (B, H, Tq, D)
    out[..., 0::2] = x[..., 1::2]  # (B, H, Tq, D/2) strided view of out
    out[..., 1::2] = x[..., 0::2]  # (B, H, Tq, D/2) strided view of out
    return out.mul_(sin2).addcmul_(x, cos2)  # (B, H, Tq, D)


def _complex_viewable(pairs: torch.Tensor) -> bool:
    """Whether ``pairs`` (``(..., D/2, 2)``) can be read in place as complex numbers.

    Needs a float32/float64 tensor off MPS (no complex dtype there; float16 and
    bfloat16 have no complex multiply on every backend) whose pairs are adjacent
    in memory and aligned: last stride 1, every other stride and the storage
    offset even. Anything else takes the real-arithmetic path, and so does a
    ``torch.compile`` graph: the compiler fuses the real form into one kernel,
    and complex views of activations trip Dynamo.
    """
    return (
        not torch.compiler.is_compiling()
        and pairs.dtype in (torch.float32, torch.float64)
        and pairs.device.type != "mps"
        and pairs.stride(-1) == 1
        and pairs.storage_offset() % 2 == 0
        and all(stride % 2 == 0 for stride in pairs.stride()[:-1])
    )


def _rotate_complex(pairs: torch.Tensor, turn: torch.Tensor) -> torch.Tensor:
    # The pair (a, b) read as a + ib times cos + i sin gives exactly
    # (a cos - b sin) + i (a sin + b cos): one fused pass, no copy of the input.
    z = torch.view_as_complex(pairs)  # (B, H, Tq, D/2) complex view of x
    return torch.view_as_real(z * turn).flatten(-2)  # (B, H, Tq, D)


def apply_rope(
    q: torch.Tensor,
    k: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate ``q`` and ``k`` by position, pairing channels ``(2i, 2i+1)``.

    Args:
        q, k: ``(B, H, Tq, D)``, same shape, dtype and device; ``D`` even.
        sin, cos: ``(1, 1, Tcache, D // 2)`` from ``rope_cache`` with
            ``Tcache >= Tq``, on q's device and dtype. Only the first ``Tq``
            positions are used.

    Returns:
        ``(q_rot, k_rot)`` with the shape, dtype and device of ``q``.

    Raises:
        AssertionError/ValueError (one type, the same as ``rope_cache``): any
            violated invariant. Nothing is cast or moved to make inputs fit.
    """
    _check_apply_inputs(q, k, sin, cos)
    t = q.shape[-2]
    sin_t, cos_t = sin[:, :, :t, :], cos[:, :, :t, :]  # (1, 1, Tq, D/2) views
    q_pairs = q.reshape(
        *q.shape[:-1], q.shape[-1] // 2, 2
    )  # (B, H, Tq, D/2, 2), a view when it can be
    k_pairs = k.reshape(*k.shape[:-1], k.shape[-1] // 2, 2)  # (B, H, Tq, D/2, 2)
    if _complex_viewable(q_pairs) and _complex_viewable(k_pairs):
        turn = torch.complex(cos_t, sin_t)  # (1, 1, Tq, D/2) complex, cos + i sin
        return _rotate_complex(q_pairs, turn), _rotate_complex(k_pairs, turn)  # (B, H, Tq, D)
    sin2, cos2 = _pair_tables(sin_t, cos_t)  # (1, 1, Tq, D) each
    return _rotate(q, sin2, cos2), _rotate(k, sin2, cos2)  # (B, H, Tq, D) each
