"""The quant stage's oracle driver (maintainer-owned; run by ``contracts pr``).

``calls(o)`` drives ``quantize_weight``, ``quantize_linear``, ``Int8Linear``
and ``quantize_int8`` with weights and inputs drawn from the verdict's secret
seed. Every answer is compared with the base's, or, for the stage's first PR,
with the float64 reference beside this file (``quant_reference.py``).

The error bound (an invariant, checked on the PR's own answers): a layer's
output ``y`` and the float layer's exact output ``x @ w^T + b`` differ, row
``o`` of the weight, by at most

    s[o] / 2 * sum_i |x[i]|  +  (I + 4) * eps * (sum_i |x[i]| |q[o, i] s[o]| + |b[o]|)

the first term from the codes (``|w - q s| <= s / 2`` elementwise), the second
the rounding of a length-``I`` product, a scale and a bias in the layer's dtype
(``eps`` of that dtype; of the autocast dtype under autocast, whose product
accumulates in float32). Since 3.0 a float32 layer's product on a CPU runs in
bfloat16 activations (``x`` and ``s`` rounded to bfloat16, each ``q * s`` and
the sum in float32, the sum rounded to bfloat16, the bias added in float32);
to first order that moves the result by ``theta`` of the terms, ``theta = 4 u16
+ (I + 2) u32`` (``u = eps / 2``: ``x``, ``s``, the sum and a bias rounding of
bfloat16 at most, ``q * s``, ``I`` additions and the bias in float32), and
``theta + theta**2`` bounds it to every order, so the second term becomes
``(theta + theta**2) (sum_i |x[i]| |q[o, i] s[o]| + |b[o]|)``, and those calls
are compared at bfloat16's tolerance (``computes_in``). Each layer call returns
``excess``, how far each output element goes past that bound (0 inside it),
and the relation says it is zero everywhere.

Domain: magnitudes over six decades, float32, float64, bfloat16 weights and
bfloat16 autocast, widths the fused kernel takes (64) and widths it does not
(40), a strided input, eval/train/no_grad/inference_mode and a
backward, drawn GPT configs, a ``state_dict`` round trip and repeated calls,
the documented bad inputs, and the stages a user stacks on a quantized model:
the fast path, a KV cache (cached chunks equal to the uncached forward),
``kv_cache.generate`` and padded batches. Size (4.0): ``quantize_weight`` of
GPT-2 small's 2304 x 768 and 3072 x 768 float32 weights and of two drawn wide
(``speckit.sizes``), and one layer forward at each, with the error bound.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import AbstractContextManager
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from speckit import sizes
from speckit.module_calls import Sized
from torch import nn

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import drop_kv_cache, generate, use_kv_cache
from niels_gpt.model.padding import padded_forward
from niels_gpt.model.quant import Int8Linear, quantize_int8, quantize_linear, quantize_weight

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

MAGNITUDES = (1e-3, 1.0, 1e3)
DTYPES = ((torch.float32, "f32"), (torch.float64, "f64"), (torch.bfloat16, "bf16"))


def _slack(dtype: torch.dtype, width: int) -> float:
    """The rounding term's factor of a ``dtype`` layer of ``width`` inputs (module docstring)."""
    if dtype == torch.float32:  # bfloat16 activations on a CPU (3.0)
        theta = 4 * torch.finfo(torch.bfloat16).eps / 2 + (width + 2) * torch.finfo(dtype).eps / 2
        return theta + theta * theta
    return (width + 4) * torch.finfo(dtype).eps


def _excess(
    layer: Int8Linear, linear: nn.Linear, x: torch.Tensor, y: torch.Tensor, eps: float
) -> torch.Tensor:
    """How far ``y`` ``(..., O)`` is past the scales' bound of the float layer's exact output;
    ``eps`` is the rounding term's factor (``_slack``) over ``I + 4``."""
    x64 = x.detach().double()  # (..., I)
    exact = x64 @ linear.weight.detach().double().T  # (..., O)
    b = torch.zeros(layer.out_features, dtype=torch.float64)  # (O,)
    if linear.bias is not None:
        b = linear.bias.detach().double()
        exact = exact + b
    s = layer.scales.detach().double()  # (O,)
    codes = layer.qweight.double() * s[:, None]  # (O, I)
    mass = x64.abs().sum(-1, keepdim=True)  # (..., 1)
    slack = (layer.in_features + 4) * eps * (x64.abs() @ codes.abs().T + b.abs())  # (..., O)
    bound = s / 2 * mass + slack  # (..., O)
    return ((y.detach().double() - exact).abs() - bound).clamp(min=0.0)  # (..., O), 0 inside


def _weights(o: Oracle) -> None:
    """``quantize_weight`` over magnitudes and dtypes; a zero row and a spiked row."""
    weights = Sized(o, stages=1, reduction=1)  # one rounding, no sum
    for dtype, short in DTYPES:
        for mag in MAGNITUDES:
            w = (mag * o.randn(48, 40, tag=f"w-{short}-{mag}")).to(dtype)  # (48, 40)
            w[3] = 0.0  # a zero row: scale 1, codes 0
            w[7, 5] = 50.0 * mag  # one large entry: the rest of row 7 rounds to few codes
            name, desc = f"weight/{short}/{mag:g}", f"(48, 40) {short} weight of scale {mag:g}"
            weights.call(name, partial(quantize_weight, w), desc=desc, axes=("magnitude", "dtype"))


def _bounded(
    o: Oracle,
    name: str,
    layers: tuple[Int8Linear, nn.Linear],
    x: torch.Tensor,
    eps: float,
    context: Callable[[], AbstractContextManager[Any]] = torch.no_grad,
) -> tuple[Callable[[], dict[str, Any]], list[dict[str, Any]]]:
    """The call ``name`` of ``layer(x)`` inside ``context()``, and its relation: what it
    returns beside ``y`` is ``excess``, how far ``y`` goes past the scales' bound of the
    float layer's exact output (``_excess``), which the relation says is zero.
    ``layers``: ``(layer, the float layer it quantizes)``."""
    layer, linear = layers

    def run() -> dict[str, Any]:
        with context():
            y = layer(x)  # (..., O)
        return {"y": y, "excess": _excess(layer, linear, x, y, eps)}

    return run, [o.zero((name, "excess", ()), says="the scales' error bound")]


def _layer(o: Oracle) -> None:
    """One layer against the float layer's exact output, over dtypes, magnitudes and widths."""
    for (dtype, short), width, bias in itertools.product(DTYPES[:2], (40, 64), (True, False)):
        eps = _slack(dtype, width) / (width + 4)
        computes = torch.bfloat16 if dtype == torch.float32 else None  # 3.0, on a CPU
        linear = nn.Linear(width, 24, bias=bias).to(dtype)
        at = "" if width == 40 else f"/I={width}"  # the fused kernel takes 64, not 40
        o.load_weights(linear, f"lin-{short}-{bias}{at}")
        layer = quantize_linear(linear).eval()
        calls = Sized(o, stages=3, reduction=width, computes_in=computes)
        for mag in MAGNITUDES:
            x = (mag * o.randn(3, 5, width, tag=f"x-{short}-{mag}{at}")).to(dtype)  # (3, 5, I)
            name = f"layer/{short}/bias={bias}/{mag:g}{at}"
            run, bound = _bounded(o, name, (layer, linear), x, eps)
            desc = f"Int8Linear({width}, 24, bias={bias}) {short}, x of scale {mag:g}"
            calls.call(name, run, desc=desc, relations=bound, axes=("magnitude", "dtype"))


def _layer_modes(o: Oracle) -> None:
    """One float32 layer 64 wide (3.0: a width the fused kernel takes): a strided input,
    autocast, a backward and ``inference_mode``, each computing in bfloat16 on a CPU."""
    linear = nn.Linear(64, 24)
    o.load_weights(linear, "lin-modes")
    layer = quantize_linear(linear)
    calls = Sized(o, stages=3, reduction=64, computes_in=torch.bfloat16)
    wide = o.randn(3, 5, 128, tag="x-wide", dtype=torch.float32)  # (3, 5, 128)
    strided = wide[:, :, ::2]  # (3, 5, 64), stride 2 in the last dim
    calls.call(
        "layer/strided", partial(layer, strided), desc="x[..., ::2] strided", axes=("layout",)
    )
    x = wide[:, :, :64].contiguous()  # (3, 5, 64)
    bf16 = partial(torch.autocast, "cpu", dtype=torch.bfloat16)
    eps = torch.finfo(torch.bfloat16).eps
    run, bound = _bounded(o, "layer/autocast", (layer.eval(), linear), x, eps, bf16)
    desc = "float32 layer under bf16 autocast"
    calls.call("layer/autocast", run, desc=desc, relations=bound, axes=("dtype",))

    def backward() -> torch.Tensor:
        xg = x.clone().requires_grad_(True)  # (3, 5, 64)
        with torch.enable_grad():
            (layer.train()(xg) * torch.linspace(-1.0, 1.0, 24)).sum().backward()
        return xg.grad if xg.grad is not None else torch.zeros(0)  # (3, 5, 64)

    # in bfloat16 too: the gradient of x @ (q s')^T, s' the scales in bfloat16
    calls.call("layer/backward", backward, desc="grad of x, train mode", axes=("modes",))
    with torch.inference_mode():
        calls.call(
            "layer/inference", partial(layer.eval(), x), desc="inference_mode", axes=("modes",)
        )


def _sizes(o: Oracle) -> None:
    """``size``: each weight of GPT-2 small's and of the wide draw quantized, and one float32
    layer of it run on ``x`` ``(2, 3, C)``, its output within the scales' error bound."""
    weights = Sized(o, stages=1, reduction=1)  # one rounding, no sum
    for size in sizes.real_sizes(o, "size"):
        for rows in size.rows:
            shape = f"{rows}x{size.C}"
            name = f"size/layer/{size.name}/{shape}"
            w = o.randn(rows, size.C, tag=f"size-w-{shape}", dtype=torch.float32)  # (O, C)
            desc = f"({rows}, {size.C}) f32 weight, {size.name} sizes"
            weight = f"size/weight/{size.name}/{shape}"
            weights.call(weight, partial(quantize_weight, w), desc=desc, axes=("size",))
            if not o.wants(name):
                continue
            linear = nn.Linear(size.C, rows)
            o.load_weights(linear, f"size-lin-{shape}")
            layer = quantize_linear(linear).eval()
            x = o.randn(2, 3, size.C, tag=f"size-x-{shape}", dtype=torch.float32)  # (2, 3, C)
            eps = _slack(torch.float32, size.C) / (size.C + 4)
            run, bound = _bounded(o, name, (layer, linear), x, eps)
            o.call(
                name,
                run,
                desc=f"Int8Linear({size.C}, {rows}) f32, x (2, 3, {size.C}), {size.name} sizes",
                stages=3,
                reduction=size.C,
                relations=bound,
                computes_in=torch.bfloat16,  # 3.0: bfloat16 activations on a CPU
                axes=("size",),
            )


def _config(o: Oracle, tag: str) -> ModelConfig:
    r = o.rng(tag)
    return ModelConfig(
        V=r.choice((61, 256)),
        T=r.choice((48, 96)),
        C=r.choice((16, 32)),
        H=r.choice((2, 4)),
        L=r.randint(1, 3),
        d_ff=r.choice((24, 48, 80)),
        dropout=r.choice((0.0, 0.2)),
        rope_theta=r.choice((10000.0, 500.0)),
    )


def _gpt(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype) -> GPT:
    gpt = GPT(cfg).to(dtype).eval()
    o.load_weights(gpt, tag)
    quantize_int8(gpt)
    return gpt


def _models(o: Oracle) -> None:
    """Quantized GPTs: logits, the stacked stages, a state_dict round trip, repeats."""
    for run, (dtype, short) in enumerate(DTYPES[:2]):
        _model(o, run, dtype, short)


def _model(o: Oracle, run: int, dtype: torch.dtype, short: str) -> None:
    """One drawn quantized GPT of ``dtype``: its logits, then each stacked stage's, a reload's
    and a repeat's; the repeat, the cached chunks and the reload equal the first logits."""
    cfg = _config(o, f"cfg{run}")
    gpt = _gpt(o, cfg, f"gpt{run}", dtype)
    ids = o.randint(cfg.V, 2, cfg.T, tag=f"ids{run}")  # (2, T)
    about = f"GPT V={cfg.V} T={cfg.T} C={cfg.C} H={cfg.H} L={cfg.L} d_ff={cfg.d_ff} {short}"
    red = max(cfg.T, cfg.C, cfg.d_ff)
    name = f"gpt/{short}"
    # 3.0: a float32 model's int8 layers compute in bfloat16 activations on a CPU
    computes = torch.bfloat16 if dtype == torch.float32 else None
    model = Sized(o, stages=16, reduction=red, computes_in=computes)

    def same(call: str) -> list[dict[str, Any]]:
        """The relation: ``call``'s logits equal the first call's."""
        return [o.equal((name, "out", ()), (call, "out", ()))]

    def chunks() -> torch.Tensor:
        n = 3 + run
        use_kv_cache(gpt, 2)
        parts = [gpt(ids[:, p : p + n]) for p in range(0, ids.shape[1], n)]
        drop_kv_cache(gpt)
        return torch.cat(parts, dim=1)  # (2, T, V)

    with torch.no_grad():
        model.call(name, partial(gpt, ids), desc=about, axes=("config",))
        again, cached, loaded = f"{name}/again", f"{name}/cached", f"{name}/loaded"
        desc = f"{about}, a second call"
        model.call(again, partial(gpt, ids), desc=desc, relations=same(again), axes=("history",))
        desc = f"{about}, cached chunks"
        model.call(cached, chunks, desc=desc, relations=same(cached), axes=("combos",))
        fast = _gpt(o, cfg, f"gpt{run}", dtype)
        use_fast_attention(fast)
        model.call(f"{name}/fast", partial(fast, ids), desc=f"{about}, fast path", axes=("combos",))
        fresh = _gpt(o, cfg, f"other{run}", dtype)
        fresh.load_state_dict(gpt.state_dict())
        desc = f"{about}, state_dict loaded"
        model.call(
            loaded, partial(fresh, ids), desc=desc, relations=same(loaded), axes=("history",)
        )
        mask = torch.ones(2, cfg.T, dtype=torch.bool)  # (2, T)
        mask[0, :5] = False
        padded = partial(padded_forward, gpt, ids, mask)
        desc = f"{about}, padded_forward, 5 pads in row 0"
        model.call(f"{name}/padded", padded, desc=desc, axes=("combos",))
    if dtype == torch.float64:
        o.call(
            f"{name}/generate",
            partial(generate, fast, ids[:, :9], 24, temperature=0),
            desc=f"{about}, fast path, greedy generate of 24",
            stages=1,
            reduction=1,
            axes=("combos",),
        )
        return

    def autocast() -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            out: torch.Tensor = gpt(ids)  # (2, T, V)
        return out

    bf16, desc = torch.bfloat16, f"{about}, bf16 autocast"  # this call's product: bfloat16
    model.call(f"{name}/autocast", autocast, desc=desc, computes_in=bf16, axes=("dtype", "combos"))


def _errors(o: Oracle) -> None:
    """The documented bad inputs: each must raise what the base (or reference) raises."""
    twice = _gpt(o, ModelConfig(V=11, T=8, C=8, H=2, L=1, d_ff=8), "twice", torch.float32)
    embedding: Any = nn.Embedding(4, 8)
    layer = quantize_linear(nn.Linear(8, 4))
    x64 = o.randn(2, 8, tag="bad-x")  # (2, 8) float64 into a float32 layer
    narrow = o.randn(2, 7, tag="bad-w", dtype=torch.float32)  # (2, 7)
    ints = torch.ones(4, 8, dtype=torch.int32)
    cases: dict[str, tuple[Callable[[], Any], str]] = {
        "already": (partial(quantize_int8, twice), "a quantized model again"),
        "embedding": (partial(quantize_linear, embedding), "nn.Embedding"),
        "dtype": (partial(layer, x64), "float64 x into a float32 layer"),
        "weight": (partial(quantize_weight, ints), "an int32 weight"),
        "width": (partial(layer, narrow), "x of width 7 into an 8-wide layer"),
    }
    for what, (fn, desc) in cases.items():
        o.call(f"bad/{what}", fn, desc=desc, stages=1, reduction=1, axes=("errors",))


def calls(o: Oracle) -> None:
    """Every call of the quant stage's oracle."""
    _weights(o)
    _layer(o)
    _layer_modes(o)
    _sizes(o)
    _models(o)
    _errors(o)
