"""Acceptance tests of the codes, the scales and one layer (stage quant).

References are written here from specs/quant.toml: the scales and codes in
float64 from their definitions, the float layer's exact output in float64,
and F.linear with the dequantized weight. The error bound of a layer, per
output element ``o`` (derivation in specs/quant/quant_oracle.py):

    |y - (x @ w^T + b)| <= s[o] / 2 * sum_i |x[i]|
                          + k (sum_i |x[i] q[o, i] s[o]| + |b[o]|)

with ``k = (I + 4) eps`` of the compute dtype, and since 3.0, for a float32
layer (bfloat16 activations on a CPU), ``k = theta + theta**2``, ``theta =
4 u16 + (I + 2) u32`` (``u = eps / 2``).
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from niels_gpt.model.quant import Int8Linear, quantize_linear, quantize_weight

Tol = Callable[[torch.dtype], dict[str, float]]
FLOAT_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _weight(seed: int, rows: int, cols: int, scale: float, dtype: torch.dtype) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(rows, cols, generator=gen, dtype=torch.float64) * scale  # (rows, cols)
    return w.to(dtype)


U16 = torch.finfo(torch.bfloat16).eps / 2  # bfloat16's unit roundoff, 2**-8
U32 = torch.finfo(torch.float32).eps / 2


def _factor(dtype: torch.dtype, width: int) -> float:
    """``k`` of the module docstring for a layer of ``dtype`` and ``width`` inputs."""
    if dtype == torch.float32:  # bfloat16 activations
        theta = 4 * U16 + (width + 2) * U32
        return theta + theta * theta
    return (width + 4) * torch.finfo(dtype).eps


def _bound_excess(
    layer: Int8Linear, linear: nn.Linear, x: torch.Tensor, y: torch.Tensor, k: float
) -> float:
    """The largest amount by which ``y`` leaves the scales' bound (0.0 inside it); ``k``
    is the rounding term's factor (module docstring)."""
    x64 = x.detach().cpu().double()  # (..., I)
    b = linear.bias.detach().cpu().double() if linear.bias is not None else torch.zeros(1)
    exact = x64 @ linear.weight.detach().cpu().double().T + b  # (..., O)
    s = layer.scales.detach().cpu().double()  # (O,)
    codes = layer.qweight.cpu().double() * s[:, None]  # (O, I)
    slack = k * (x64.abs() @ codes.abs().T + b.abs())  # (..., O)
    bound = s / 2 * x64.abs().sum(-1, keepdim=True) + slack  # (..., O)
    return float(((y.detach().cpu().double() - exact).abs() - bound).clamp(min=0).max())


@pytest.mark.invariant("quant.codes_and_scales")
@settings(max_examples=30, deadline=None)
@given(
    rows=st.integers(1, 40),
    cols=st.integers(1, 70),
    scale=st.sampled_from((1e-4, 1e-2, 1.0, 30.0, 1e4)),
    dtype=st.sampled_from(FLOAT_DTYPES),
    seed=st.integers(0, 2**31 - 1),
)
def test_codes_and_scales_follow_their_definitions(
    device: torch.device, rows: int, cols: int, scale: float, dtype: torch.dtype, seed: int
) -> None:
    w = _weight(seed, rows, cols, scale, dtype).to(device)  # (rows, cols)
    w[0] = 0.0  # a zero row
    before = w.clone()
    q, s = quantize_weight(w)
    assert torch.equal(w, before)  # the weight is not modified
    assert q.dtype == torch.int8 and q.shape == (rows, cols) and q.device == w.device
    assert s.dtype == dtype and s.shape == (rows,) and s.device == w.device
    w64, q64 = w.cpu().double(), q.cpu().double()
    amax = w64.abs().amax(dim=1)  # (rows,)
    want = (amax / 127).to(dtype)  # (rows,) nearest, then up where it fell below
    want = torch.where(
        want.double() * 127 >= amax, want, torch.nextafter(want, want + float("inf"))
    )
    want = torch.where(want == 0, torch.ones_like(want), want)
    assert torch.equal(s.cpu(), want)
    assert float(s[0]) == 1.0 and not bool(q[0].any())
    s64 = s.cpu().double()[:, None]  # (rows, 1)
    assert torch.equal(q64, torch.round(w64 / s64).clamp(-127, 127))
    assert int(q.abs().max()) <= 127
    assert bool(((w64 - q64 * s64).abs() <= s64 / 2).all())


@pytest.mark.invariant("quant.codes_and_scales")
def test_codes_round_in_float64_not_in_the_weight_dtype(device: torch.device) -> None:
    # bfloat16 quotients near k + 1/2 round before the code does; the codes must not.
    w = _weight(7, 64, 256, 1.0, torch.bfloat16).to(device)  # (64, 256)
    q, s = quantize_weight(w)
    exact = torch.round(w.cpu().double() / s.cpu().double()[:, None]).clamp(-127, 127)
    assert torch.equal(q.cpu().double(), exact)


@pytest.mark.invariant("quant.error_bound")
@settings(max_examples=25, deadline=None)
@given(
    width=st.one_of(st.integers(1, 96), st.sampled_from((32, 64, 96))),  # the kernel's widths too
    out=st.integers(1, 48),
    bias=st.booleans(),
    wscale=st.sampled_from((1e-3, 1.0, 1e3)),
    xscale=st.sampled_from((1e-3, 1.0, 1e3)),
    dtype=st.sampled_from((torch.float32, torch.float64)),
    seed=st.integers(0, 2**31 - 1),
)
def test_a_layer_stays_within_the_bound_its_scales_give(
    device: torch.device,
    width: int,
    out: int,
    bias: bool,
    wscale: float,
    xscale: float,
    dtype: torch.dtype,
    seed: int,
) -> None:
    linear = nn.Linear(width, out, bias=bias).to(device=device, dtype=dtype)
    with torch.no_grad():
        linear.weight.copy_(_weight(seed, out, width, wscale, dtype))
        if linear.bias is not None:
            linear.bias.copy_(_weight(seed + 1, 1, out, wscale, dtype)[0])
    layer = quantize_linear(linear)
    x = _weight(seed + 2, 6, width, xscale, dtype).to(device).view(2, 3, width)  # (2, 3, I)
    with torch.no_grad():
        y = layer(x)  # (2, 3, O)
    assert y.shape == (2, 3, out) and y.dtype == dtype
    assert _bound_excess(layer, linear, x, y, _factor(dtype, width)) == 0.0


@pytest.mark.invariant("quant.error_bound")
def test_the_bound_holds_under_autocast(
    device: torch.device, autocast_dtypes: tuple[torch.dtype, ...]
) -> None:
    linear = nn.Linear(64, 40).to(device)
    layer = quantize_linear(linear)
    x = _weight(3, 10, 64, 1.0, torch.float32).to(device)  # (10, 64)
    for dtype in autocast_dtypes:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            y = layer(x)  # (10, 40)
            want = linear(x)  # (10, 40): nn.Linear's dtype under the same autocast
        assert y.dtype == want.dtype == dtype
        assert _bound_excess(layer, linear, x, y, 68 * torch.finfo(dtype).eps) == 0.0


@pytest.mark.invariant("quant.matches_dequantized")
@settings(max_examples=20, deadline=None)
@given(
    width=st.integers(1, 64),
    out=st.integers(1, 40),
    bias=st.booleans(),
    dtype=st.sampled_from((torch.float32, torch.float64)),
    seed=st.integers(0, 2**31 - 1),
)
def test_forward_is_f_linear_with_the_dequantized_weight(
    device: torch.device,
    tol: Tol,
    mixed_close: Callable[..., None],
    width: int,
    out: int,
    bias: bool,
    dtype: torch.dtype,
    seed: int,
) -> None:
    linear = nn.Linear(width, out, bias=bias).to(device=device, dtype=dtype)
    layer = quantize_linear(linear)
    w = layer.dequantize()  # (O, I)
    assert w.dtype == dtype and w.shape == (out, width)
    exact = layer.qweight.cpu().double() * layer.scales.cpu().double()[:, None]  # (O, I)
    assert torch.equal(w.cpu(), exact.to(dtype))  # one rounding of an exact product
    x = _weight(seed, 5, width, 1.0, dtype).to(device)  # (5, I)
    strided = torch.stack((x, x), dim=-1)[..., 0]  # (5, I), last-dim stride 2
    xg = x.clone().requires_grad_(True)
    layer(xg).sum().backward()  # differentiable in x
    assert xg.grad is not None
    with torch.no_grad():
        want = F.linear(x, w, layer.bias)  # (5, O)
        got, got_strided = layer(x), layer(strided)  # (5, O) each
    if dtype == torch.float64:
        torch.testing.assert_close(got, want, **tol(dtype))
        torch.testing.assert_close(got_strided, want, **tol(dtype))
        torch.testing.assert_close(xg.grad, w.sum(0).expand(5, width), **tol(dtype))
        return
    # 3.0: float32 runs in bfloat16 activations: bfloat16's bound over the terms' size,
    # two stages (the product and the bias)
    x64, w64 = x.cpu().double(), w.cpu().double()  # (5, I), (O, I)
    b64 = layer.bias.cpu().double() if layer.bias is not None else torch.zeros(out).double()
    terms = float((x64.abs() @ w64.abs().T + b64.abs()).max())
    exact = x64 @ w64.T + b64  # (5, O)
    for y in (got, got_strided):
        mixed_close(y, exact, dtype=torch.bfloat16, stages=2, reduction=width, terms=terms)
    grad = w64.sum(0).expand(5, width)  # (5, I): the scales' own rounding, one stage
    size = float(w64.abs().sum(0).max())
    mixed_close(xg.grad, grad, dtype=torch.bfloat16, stages=1, reduction=out, terms=size)


@pytest.mark.invariant("quant.error_bound")
def test_float16_autocast_on_a_cpu_keeps_f_linear_and_its_dtype() -> None:
    # float16 autocast is not the bfloat16 product: F.linear in float16, then the scales
    linear = nn.Linear(64, 40)
    layer = quantize_linear(linear)
    x = _weight(5, 10, 64, 1.0, torch.float32)  # (10, 64)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        y = layer(x)  # (10, 40)
        want = linear(x)  # (10, 40)
    assert y.dtype == want.dtype == torch.float16
    assert _bound_excess(layer, linear, x, y, 68 * torch.finfo(torch.float16).eps) == 0.0


def _aten_ops(fn: Callable[[], torch.Tensor]) -> list[str]:
    """The ``aten::`` op names ``fn()`` dispatches on the CPU, in order (the profiler)."""
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof:
        fn()
    return [e.name for e in prof.events() if e.name.startswith("aten::")]


PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::matmul", "aten::linear"}


@pytest.mark.invariant("quant.fused_kernel")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_cpu_product_is_the_fused_kernel_in_bfloat16(
    device: torch.device, mixed_close: Callable[..., None], dtype: torch.dtype
) -> None:
    if device.type != "cpu":
        pytest.skip("the fused int8 kernel is the CPU's (issue 49)")
    linear = nn.Linear(96, 40).to(dtype)  # 96: a multiple of 32
    layer = quantize_linear(linear)
    x = _weight(11, 12, 96, 1.0, dtype).view(3, 4, 96)  # (3, 4, 96)
    with torch.no_grad():
        ops = _aten_ops(lambda: layer(x))
        y = layer(x)  # (3, 4, 40)
    assert ops.count("aten::_weight_int8pack_mm") == 1 and not PRODUCTS & set(ops), ops
    assert y.dtype == dtype
    # the kernel's answer: x and s rounded to bfloat16, each q * s and the sum in float32,
    # the sum rounded once to bfloat16; then the bias in the layer's dtype
    xb = x.to(torch.bfloat16).double()  # (3, 4, I)
    sb = layer.scales.to(torch.bfloat16).double()  # (O,)
    terms = xb.abs() @ (layer.qweight.double().abs() * sb[:, None]).T  # (3, 4, O)
    exact = xb @ (layer.qweight.double() * sb[:, None]).T  # (3, 4, O)
    assert layer.bias is not None
    got = y.double() - layer.bias.double()  # (3, 4, O) the product (the bias's rounding below)
    bias_rounding = torch.finfo(dtype).eps / 2 * (y.double().abs() + layer.bias.double().abs())
    allowed = U16 * exact.abs() + 1.01 * 98 * U32 * terms + bias_rounding  # (3, 4, O)
    assert bool(((got - exact).abs() <= allowed).all())


@pytest.mark.invariant("quant.fused_kernel")
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_the_compiled_bfloat16_product_is_the_fused_kernel(device: torch.device) -> None:
    if device.type != "cpu":
        pytest.skip("the fused int8 kernel is the CPU's (issue 49)")
    # a bfloat16 layer: a float32 one compiles F.linear (inductor cannot take its scales)
    layer = quantize_linear(nn.Linear(64, 32).to(torch.bfloat16)).eval()
    x = _weight(12, 2, 64, 1.0, torch.bfloat16)  # (2, 64)
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")  # no toolchain needed
    with torch.no_grad():
        eager = layer(x)  # (2, 32)
        compiled(x)  # compiles
        ops = _aten_ops(lambda: compiled(x))
        again = compiled(x)  # (2, 32)
    assert "aten::_weight_int8pack_mm" in ops and not PRODUCTS & set(ops), ops
    assert torch.equal(again, eager)
