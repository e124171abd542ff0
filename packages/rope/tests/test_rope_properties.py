"""Property tests of RoPE on the session's device, against independent references.

Reference: each channel pair ``(x[2i], x[2i+1])`` read as the complex number
``x[2i] + 1j*x[2i+1]`` and multiplied by ``exp(1j * p * theta**(-2i/D))``,
with the angles computed from Python floats (float64) on the CPU.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.model import rope
from niels_gpt.model.rope import apply_rope, rope_cache

Tol = Callable[[torch.dtype], dict[str, float]]

shapes = st.tuples(
    st.integers(1, 3),  # B
    st.integers(1, 4),  # H
    st.integers(1, 24),  # Tq
    st.integers(1, 16).map(lambda half: 2 * half),  # D
    st.integers(0, 8),  # extra cache length beyond Tq
)
thetas = st.sampled_from([10.0, 500.0, 10000.0, 1e6])


def reference_angles(T: int, D: int, theta: float) -> torch.Tensor:
    rows = [[p * theta ** (-2 * i / D) for i in range(D // 2)] for p in range(T)]
    return torch.tensor(rows, dtype=torch.float64)  # (T, D/2)


def reference_rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """Complex-number RoPE of ``x`` (B, H, T, D) in float64 on the CPU."""
    x = x.detach().to("cpu", torch.float64)
    T, D = x.shape[-2], x.shape[-1]
    z = torch.complex(x[..., 0::2], x[..., 1::2])  # (B, H, T, D/2)
    turn = torch.polar(torch.ones(T, D // 2, dtype=torch.float64), reference_angles(T, D, theta))
    rotated = z * turn  # (B, H, T, D/2)
    out = torch.empty_like(x)  # (B, H, T, D)
    out[..., 0::2] = rotated.real
    out[..., 1::2] = rotated.imag
    return out


def _dtypes(float_dtypes: tuple[torch.dtype, ...]) -> st.SearchStrategy[torch.dtype]:
    return st.sampled_from(float_dtypes)


@pytest.mark.invariant("rope.cache_values")
@given(T=st.integers(1, 40), half=st.integers(1, 16), theta=thetas, data=st.data())
def test_cache_equals_float64_reference_rounded_once(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    T: int,
    half: int,
    theta: float,
    data: st.DataObject,
) -> None:
    dtype = data.draw(_dtypes(float_dtypes))
    sin, cos = rope_cache(T, 2 * half, theta=theta, device=device, dtype=dtype)
    angles = reference_angles(T, 2 * half, theta)  # (T, D/2)
    # Angles are computed wider than the output dtype: the result is the exact
    # value rounded once, so it equals the float64 reference cast to dtype.
    exact_sin = angles.sin().to(dtype).view(1, 1, T, half)  # (1, 1, T, D/2)
    exact_cos = angles.cos().to(dtype).view(1, 1, T, half)  # (1, 1, T, D/2)
    # One rounding to dtype, plus the float64 angle error (a few ulps of the
    # largest angle, T - 1 radians) that two float64 formulas may disagree by.
    angle_error = 4 * torch.finfo(torch.float64).eps * T
    ulp = {"rtol": 0.0, "atol": float(torch.finfo(dtype).eps) + angle_error}
    torch.testing.assert_close(sin.cpu(), exact_sin, **ulp)
    torch.testing.assert_close(cos.cpu(), exact_cos, **ulp)


@pytest.mark.invariant("rope.cache_shape_defaults")
@given(T=st.integers(1, 64), half=st.integers(1, 32), data=st.data())
def test_cache_shape_device_dtype(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    T: int,
    half: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(_dtypes(float_dtypes))
    sin, cos = rope_cache(T, 2 * half, device=device, dtype=dtype)
    for table in (sin, cos):
        assert table.shape == (1, 1, T, half)
        assert table.dtype == dtype
        assert table.device.type == device.type
    default_sin, _ = rope_cache(T, 2 * half)
    assert (default_sin.dtype, default_sin.device.type) == (torch.float32, "cpu")


@pytest.mark.invariant("rope.cache_values")
def test_cache_goes_to_the_requested_device_and_dtype() -> None:
    """device= and dtype= at non-default values on any machine: the meta device
    exists everywhere, so ignoring device= shows even where only a CPU does."""
    sin, cos = rope_cache(6, 4, device="meta", dtype=torch.bfloat16)
    for table in (sin, cos):
        assert (table.device.type, table.dtype, table.shape) == (
            "meta",
            torch.bfloat16,
            (1, 1, 6, 2),
        )
    sin, _ = rope_cache(6, 4, device=torch.device("meta"))
    assert (sin.device.type, sin.dtype) == ("meta", torch.float32)


@pytest.mark.invariant("rope.matches_complex_reference")
@given(shape=shapes, theta=thetas, seed=st.integers(0, 2**16), data=st.data())
def test_apply_rope_matches_complex_reference(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    shape: tuple[int, int, int, int, int],
    theta: float,
    seed: int,
    data: st.DataObject,
) -> None:
    B, H, T, D, extra = shape
    dtype = data.draw(_dtypes(float_dtypes))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)  # (B, H, T, D)
    k = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)  # (B, H, T, D)
    sin, cos = rope_cache(T + extra, D, theta=theta, device=device, dtype=dtype)
    q_rot, k_rot = apply_rope(q.to(device, dtype), k.to(device, dtype), sin, cos)
    for x, x_rot in ((q, q_rot), (k, k_rot)):
        assert (x_rot.shape, x_rot.dtype, x_rot.device.type) == (x.shape, dtype, device.type)
        expected = reference_rope(x.to(dtype), theta).to(dtype)  # (B, H, T, D)
        torch.testing.assert_close(x_rot.cpu(), expected, **tol(dtype))


@pytest.mark.invariant("rope.relative_position")
@given(T=st.integers(2, 24), half=st.integers(1, 16), theta=thetas, seed=st.integers(0, 2**16))
def test_scores_depend_only_on_relative_position(
    device: torch.device, T: int, half: int, theta: float, seed: int
) -> None:
    """Same q and k vectors at every position: q_m . k_n must be a function of m - n."""
    dtype = torch.float64 if device.type != "mps" else torch.float32
    D = 2 * half
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(D, generator=gen).expand(1, 1, T, D).to(device, dtype)  # (1, 1, T, D)
    k = torch.randn(D, generator=gen).expand(1, 1, T, D).to(device, dtype)  # (1, 1, T, D)
    sin, cos = rope_cache(T, D, theta=theta, device=device, dtype=dtype)
    q_rot, k_rot = apply_rope(q, k, sin, cos)
    scores = (q_rot @ k_rot.transpose(-2, -1))[0, 0].cpu().double()  # (T, T)
    # Toeplitz: every diagonal (fixed m - n) is constant.
    torch.testing.assert_close(scores[1:, 1:], scores[:-1, :-1], rtol=1e-4, atol=1e-4)
    # and position 0 is the identity rotation
    torch.testing.assert_close(q_rot[..., 0, :], q[..., 0, :])


@pytest.mark.invariant("rope.pair_norm_preserved")
@given(shape=shapes, seed=st.integers(0, 2**16), data=st.data())
def test_pair_norms_preserved(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    shape: tuple[int, int, int, int, int],
    seed: int,
    data: st.DataObject,
) -> None:
    B, H, T, D, extra = shape
    dtype = data.draw(_dtypes(float_dtypes))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen).to(device, dtype)  # (B, H, T, D)
    sin, cos = rope_cache(T + extra, D, device=device, dtype=dtype)
    q_rot, _ = apply_rope(q, q, sin, cos)

    def pair_norms(x: torch.Tensor) -> torch.Tensor:
        return x.reshape(B, H, T, D // 2, 2).pow(2).sum(-1).sqrt()  # (B, H, T, D/2)

    torch.testing.assert_close(pair_norms(q_rot), pair_norms(q), **tol(dtype))


@pytest.mark.invariant("rope.cache_slicing")
@given(shape=shapes, seed=st.integers(0, 2**16))
def test_long_cache_equals_exact_length_cache(
    device: torch.device, shape: tuple[int, int, int, int, int], seed: int
) -> None:
    B, H, T, D, extra = shape
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen).to(device)  # (B, H, T, D)
    k = torch.randn(B, H, T, D, generator=gen).to(device)  # (B, H, T, D)
    long_q, long_k = apply_rope(q, k, *rope_cache(T + extra, D, device=device))
    exact_q, exact_k = apply_rope(q, k, *rope_cache(T, D, device=device))
    assert torch.equal(long_q, exact_q)
    assert torch.equal(long_k, exact_k)


def _bad_inputs(device: torch.device) -> dict[str, tuple[torch.Tensor, ...]]:
    def t(*size: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.zeros(*size, dtype=dtype, device=device)

    sin, cos = rope_cache(8, 4, device=device)  # (1, 1, 8, 2)
    q = t(1, 2, 8, 4)  # (B, H, T, D)
    cases = {
        "q is 3-D": (t(2, 8, 4), t(2, 8, 4), sin, cos),
        "q and k differ": (q, t(1, 2, 7, 4), sin, cos),
        "odd D": (t(1, 2, 8, 5), t(1, 2, 8, 5), t(1, 1, 8, 2), t(1, 1, 8, 2)),
        "sin and cos differ": (q, q, sin, t(1, 1, 9, 2)),
        "cache leading dims": (q, q, t(2, 1, 8, 2), t(2, 1, 8, 2)),
        "cache 3-D": (q, q, t(1, 8, 2), t(1, 8, 2)),
        "cache last dim": (q, q, t(1, 1, 8, 4), t(1, 1, 8, 4)),
        "cache too short": (q, q, sin[:, :, :7], cos[:, :, :7]),
        "sin dtype": (q, q, sin.half(), cos),
        "cos dtype": (q, q, sin, cos.half()),
        "k dtype": (q, q.half(), sin, cos),
        "integer q": (q.long(), q.long(), sin, cos),
    }
    if device.type != "cpu":
        cases["sin device"] = (q, q, sin.cpu(), cos)
        cases["cos device"] = (q, q, sin, cos.cpu())
    return cases


@pytest.mark.invariant("rope.rejects_bad_input")
def test_every_broken_invariant_raises_one_exception_type(device: torch.device) -> None:
    raised: set[type[BaseException]] = set()
    for case, args in _bad_inputs(device).items():
        with pytest.raises(AssertionError) as info:
            apply_rope(*args)
        assert isinstance(info.value, ValueError), case
        raised.add(type(info.value))
    for kwargs in (
        {"T": 8, "D": 7},
        {"T": 0, "D": 4},
        {"T": 8, "D": 0},
        {"T": 8, "D": 4, "theta": -1.0},
    ):
        with pytest.raises(AssertionError) as info:
            rope_cache(**kwargs)  # type: ignore[arg-type]
        raised.add(type(info.value))
    with pytest.raises(AssertionError) as info:
        rope_cache(8, 4, dtype=torch.int64)
    raised.add(type(info.value))
    assert len(raised) == 1, f"one exception type expected, got {raised}"


@pytest.mark.invariant("rope.rejects_bad_input")
def test_apply_rope_never_casts_or_moves(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No ``.to``/``.type``/``.float``/... call may run inside ``apply_rope``."""
    q = torch.randn(1, 2, 8, 4, device=device)  # (B, H, T, D)
    sin, cos = rope_cache(8, 4, device=device)
    calls: list[str] = []
    for name in ("to", "type", "float", "double", "half", "bfloat16", "cpu", "cuda", "type_as"):
        original = getattr(torch.Tensor, name)

        def spy(
            self: torch.Tensor, *a: object, _n: str = name, _o: object = original, **kw: object
        ):  # type: ignore[no-untyped-def]
            calls.append(_n)
            return _o(self, *a, **kw)  # type: ignore[operator]

        monkeypatch.setattr(torch.Tensor, name, spy)
    rope.apply_rope(q, q, sin, cos)
    monkeypatch.undo()
    assert calls == [], f"apply_rope called {calls}"


def _unaligned(x: torch.Tensor) -> torch.Tensor:
    """The same values at an odd storage offset, so no complex view is possible."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)
    view = flat[1:].view(x.shape)  # (B, H, T, D) at offset 1
    view.copy_(x)
    return view


@pytest.mark.invariant("rope.matches_complex_reference")
@given(shape=shapes, theta=thetas, seed=st.integers(0, 2**16), data=st.data())
def test_real_arithmetic_path_matches_reference(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    shape: tuple[int, int, int, int, int],
    theta: float,
    seed: int,
    data: st.DataObject,
) -> None:
    """Inputs that cannot be viewed as complex pairs (misaligned, or half precision)
    take the real-arithmetic rotation; it must give the same rotation."""
    B, H, T, D, extra = shape
    dtype = data.draw(st.sampled_from([*float_dtypes, torch.float16, torch.bfloat16]))
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)  # (B, H, T, D)
    k = torch.randn(B, H, T, D, generator=gen, dtype=torch.float64)  # (B, H, T, D)
    sin, cos = rope_cache(T + extra, D, theta=theta, device=device, dtype=dtype)
    q_in, k_in = _unaligned(q.to(device, dtype)), _unaligned(k.to(device, dtype))
    q_rot, k_rot = apply_rope(q_in, k_in, sin, cos)
    # half precision: a few ulps of the largest value for the sum of two products
    eps = torch.finfo(dtype).eps
    close = tol(dtype) if dtype in float_dtypes else {"rtol": 4 * eps, "atol": 8 * eps}
    for x, x_rot in ((q, q_rot), (k, k_rot)):
        assert (x_rot.shape, x_rot.dtype, x_rot.device.type) == (x.shape, dtype, device.type)
        expected = reference_rope(x.to(dtype), theta)  # (B, H, T, D) in float64
        torch.testing.assert_close(x_rot.cpu().double(), expected, **close)
