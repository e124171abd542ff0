"""The quant stage's own tests: layers in any module tree, with core alone installed.

The acceptance tests (specs/quant/tests) judge the contract on a GPT and
under the other stages; these pin what the package promises to a user who
brings their own modules: a plain ``nn.Sequential``, shared weights, float16
and bfloat16 layers, moving a quantized tree between dtypes.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from niels_gpt.checks import InputError
from niels_gpt.model.quant import Int8Linear, quantize_int8, quantize_linear, quantize_weight

Tol = Callable[[torch.dtype], dict[str, float]]


def _mlp(device: torch.device, dtype: torch.dtype = torch.float32) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(12, 20), nn.GELU(), nn.Linear(20, 5, bias=False)).to(
        device=device, dtype=dtype
    )


@pytest.mark.invariant("quant.linears_only")
def test_any_tree_of_linears_is_quantized_in_place(
    device: torch.device, mixed_close: Callable[..., None]
) -> None:
    net = _mlp(device).eval()
    x = torch.randn(4, 12, device=device)  # (4, 12)
    first, second = net[0], net[2]
    assert quantize_int8(net) is net
    assert isinstance(net[0], Int8Linear) and isinstance(net[2], Int8Linear)
    assert type(net[1]) is nn.GELU and not net[0].training
    with torch.no_grad():
        want = F.linear(F.gelu(F.linear(x, net[0].dequantize(), net[0].bias)), net[2].dequantize())
        # float32 int8 layers run in bfloat16 activations on a CPU (spec 3.0): its bound,
        # two layers of two stages (product, bias) and the GELU between
        mixed_close(net(x), want.double(), dtype=torch.bfloat16, stages=5, reduction=20)
    q, _ = quantize_weight(first.weight)
    assert torch.equal(net[0].qweight, q) and second.weight.dtype == torch.float32


@pytest.mark.invariant("quant.linears_only")
def test_a_weight_shared_by_two_linears_stays_float(device: torch.device) -> None:
    net = _mlp(device)
    tied = nn.Linear(12, 20).to(device)
    tied.weight = net[0].weight  # two modules hold one Parameter
    tree = nn.ModuleDict({"net": net, "tied": tied})
    quantize_int8(tree)
    assert type(net[0]) is nn.Linear and tree["tied"] is tied and tied.weight is net[0].weight
    assert isinstance(net[2], Int8Linear)


@pytest.mark.invariant("quant.error_bound")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_16_bit_layers_keep_their_dtype_and_the_bound(
    device: torch.device, dtype: torch.dtype
) -> None:
    linear = nn.Linear(32, 8).to(device=device, dtype=dtype)
    layer = quantize_linear(linear)
    assert layer.bias is not None and layer.scales.dtype == layer.bias.dtype == dtype
    x = torch.randn(3, 32, device=device, dtype=dtype)  # (3, 32)
    with torch.no_grad():
        y = layer(x)  # (3, 8)
    assert y.dtype == dtype
    x64 = x.double().cpu()
    exact = x64 @ linear.weight.double().cpu().T + linear.bias.double().cpu()  # (3, 8)
    s = layer.scales.double().cpu()  # (8,)
    codes = (layer.qweight.double().cpu() * s[:, None]).abs()  # (8, 32)
    eps = torch.finfo(dtype).eps
    bound = s / 2 * x64.abs().sum(-1, keepdim=True) + 36 * eps * (x64.abs() @ codes.T + exact.abs())
    assert bool(((y.double().cpu() - exact).abs() <= bound).all())


@pytest.mark.invariant("quant.state_dict_round_trip")
def test_a_quantized_tree_moves_between_dtypes(device: torch.device) -> None:
    net = quantize_int8(_mlp(device))
    net.to(torch.float64)
    layer = net[0]
    assert isinstance(layer, Int8Linear)
    assert layer.qweight.dtype == torch.int8 and layer.scales.dtype == torch.float64
    assert layer.weight.dtype == torch.float64  # the stand-in follows the scales
    shell = Int8Linear(12, 20, dtype=torch.float64, device=device)
    shell.load_state_dict(layer.state_dict())
    x = torch.randn(2, 12, dtype=torch.float64, device=device)  # (2, 12)
    with torch.no_grad():
        assert torch.equal(shell(x), layer(x))


@pytest.mark.invariant("quant.rejects_bad_input")
def test_a_layer_on_another_device_or_width_is_refused(device: torch.device) -> None:
    layer = quantize_linear(nn.Linear(6, 3).to(device))
    with pytest.raises(InputError, match=r"\(\.\.\., 6\)"):
        layer(torch.zeros(6, device=device)[None, :5])
    with pytest.raises(InputError, match=r"torch\.float32"):
        layer(torch.zeros(2, 6, dtype=torch.float16, device=device))
    with pytest.raises(InputError, match="Tensor"):
        quantize_weight([[1.0]])  # type: ignore[arg-type]


@pytest.mark.invariant("quant.fused_kernel")
def test_a_misaligned_or_strided_input_gets_the_kernel_s_answer(device: torch.device) -> None:
    # the fused kernel reads whole aligned vectors and checks nothing: the layer must hand it
    # contiguous, aligned operands (a view two bytes into a buffer is neither)
    layer = quantize_linear(_mlp(device, torch.bfloat16)[0])  # (20, 12): the F.linear path
    wide = quantize_linear(nn.Linear(64, 24).to(device=device, dtype=torch.bfloat16))
    buf = torch.randn(4 * 64 + 1, device=device).to(torch.bfloat16)  # (257,)
    views = {"offset": buf[1:].view(4, 64), "strided": buf[:256].view(2, 128)[:, ::2]}
    aligned = {k: v.clone() for k, v in views.items()}  # fresh, contiguous copies
    with torch.no_grad():
        for name, x in views.items():
            assert torch.equal(wide(x), wide(aligned[name])), name
        assert layer(torch.ones(3, 12, device=device, dtype=torch.bfloat16)).dtype == torch.bfloat16


@pytest.mark.invariant("quant.fused_kernel")
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_inductor_compiles_bfloat16_and_float32_layers(
    device: torch.device, mixed_close: Callable[..., None]
) -> None:
    # inductor lowers _weight_int8pack_mm itself and asserts its scales are in memory: a
    # bfloat16 layer's are (the kernel, as eager); a float32 layer's would be converted inside
    # the graph (LoweringException), so it compiles the same roundings through F.linear
    if device.type != "cpu":
        pytest.skip("the fused int8 kernel is the CPU's")
    linear = nn.Linear(32, 16)
    for dtype in (torch.bfloat16, torch.float32):
        layer = quantize_linear(linear.to(dtype)).eval()
        x = torch.randn(1, 1, 32).to(dtype)  # (1, 1, 32): a decode step's row
        compiled = torch.compile(layer, fullgraph=True)  # inductor, as compile_step=True
        with torch.no_grad():
            got, want = compiled(x), layer(x)  # (1, 1, 16) each
        if dtype == torch.bfloat16:
            assert torch.equal(got, want)
        else:  # two orders of a float32 sum, each rounded once to bfloat16
            mixed_close(got, want.double(), dtype=torch.bfloat16, stages=2, reduction=32)
