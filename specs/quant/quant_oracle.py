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
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from speckit import sizes
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
    for dtype, short in DTYPES:
        for mag in MAGNITUDES:
            w = (mag * o.randn(48, 40, tag=f"w-{short}-{mag}")).to(dtype)  # (48, 40)
            w[3] = 0.0  # a zero row: scale 1, codes 0
            w[7, 5] = 50.0 * mag  # one large entry: the rest of row 7 rounds to few codes
            o.call(
                f"weight/{short}/{mag:g}",
                partial(quantize_weight, w),
                desc=f"(48, 40) {short} weight of scale {mag:g}",
                stages=1,
                reduction=1,
                axes=("magnitude", "dtype"),
            )


def _layer(o: Oracle) -> None:
    """One layer against the float layer's exact output, over dtypes, magnitudes and modes."""
    for (dtype, short), width, bias in itertools.product(DTYPES[:2], (40, 64), (True, False)):
        eps = _slack(dtype, width) / (width + 4)
        computes = torch.bfloat16 if dtype == torch.float32 else None  # 3.0, on a CPU
        linear = nn.Linear(width, 24, bias=bias).to(dtype)
        at = "" if width == 40 else f"/I={width}"  # the fused kernel takes 64, not 40
        o.load_weights(linear, f"lin-{short}-{bias}{at}")
        layer = quantize_linear(linear).eval()
        for mag in MAGNITUDES:
            x = (mag * o.randn(3, 5, width, tag=f"x-{short}-{mag}{at}")).to(dtype)  # (3, 5, I)
            name = f"layer/{short}/bias={bias}/{mag:g}{at}"

            def run(
                x: torch.Tensor = x,
                layer: Int8Linear = layer,
                linear: nn.Linear = linear,
                eps: float = eps,
            ) -> dict[str, Any]:
                with torch.no_grad():
                    y = layer(x)  # (3, 5, 24)
                return {"y": y, "excess": _excess(layer, linear, x, y, eps)}

            o.call(
                name,
                run,
                desc=f"Int8Linear({width}, 24, bias={bias}) {short}, x of scale {mag:g}",
                stages=3,
                reduction=width,
                relations=[o.zero((name, "excess", ()), says="the scales' error bound")],
                computes_in=computes,
                axes=("magnitude", "dtype"),
            )
    linear = nn.Linear(64, 24)  # 3.0: a width the fused kernel takes
    o.load_weights(linear, "lin-modes")
    layer = quantize_linear(linear)
    wide = o.randn(3, 5, 128, tag="x-wide", dtype=torch.float32)  # (3, 5, 128)
    strided = wide[:, :, ::2]  # (3, 5, 64), stride 2 in the last dim
    o.call(
        "layer/strided",
        partial(layer, strided),
        desc="x[..., ::2] strided",
        stages=3,
        reduction=64,
        computes_in=torch.bfloat16,
        axes=("layout",),
    )
    x = wide[:, :, :64].contiguous()  # (3, 5, 64)

    def autocast() -> dict[str, Any]:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = layer.eval()(x)  # (3, 5, 24) bfloat16
        return {"y": y, "excess": _excess(layer, linear, x, y, torch.finfo(torch.bfloat16).eps)}

    o.call(
        "layer/autocast",
        autocast,
        desc="float32 layer under bf16 autocast",
        stages=3,
        reduction=64,
        computes_in=torch.bfloat16,
        axes=("dtype",),
        relations=[o.zero(("layer/autocast", "excess", ()), says="the scales' error bound")],
    )

    def backward() -> torch.Tensor:
        xg = x.clone().requires_grad_(True)  # (3, 5, 64)
        with torch.enable_grad():
            (layer.train()(xg) * torch.linspace(-1.0, 1.0, 24)).sum().backward()
        return xg.grad if xg.grad is not None else torch.zeros(0)  # (3, 5, 64)

    o.call(
        "layer/backward",
        backward,
        desc="grad of x, train mode",
        stages=3,
        reduction=64,
        computes_in=torch.bfloat16,  # the gradient of x @ (q s')^T, s' the scales in bfloat16
        axes=("modes",),
    )
    with torch.inference_mode():
        o.call(
            "layer/inference",
            partial(layer.eval(), x),
            desc="inference_mode",
            stages=3,
            reduction=64,
            computes_in=torch.bfloat16,
            axes=("modes",),
        )


def _sizes(o: Oracle) -> None:
    """``size``: each weight of GPT-2 small's and of the wide draw quantized, and one float32
    layer of it run on ``x`` ``(2, 3, C)``, its output within the scales' error bound."""
    for size in sizes.real_sizes(o, "size"):
        for rows in size.rows:
            shape = f"{rows}x{size.C}"
            name = f"size/layer/{size.name}/{shape}"
            w = o.randn(rows, size.C, tag=f"size-w-{shape}", dtype=torch.float32)  # (O, C)
            o.call(
                f"size/weight/{size.name}/{shape}",
                partial(quantize_weight, w),
                desc=f"({rows}, {size.C}) f32 weight, {size.name} sizes",
                stages=1,
                reduction=1,
                axes=("size",),
            )
            if not o.wants(name):
                continue
            linear = nn.Linear(size.C, rows)
            o.load_weights(linear, f"size-lin-{shape}")
            layer = quantize_linear(linear).eval()
            x = o.randn(2, 3, size.C, tag=f"size-x-{shape}", dtype=torch.float32)  # (2, 3, C)

            def run(
                x: torch.Tensor = x, layer: Int8Linear = layer, linear: nn.Linear = linear
            ) -> dict[str, Any]:
                with torch.no_grad():
                    y = layer(x)  # (2, 3, O)
                eps = _slack(torch.float32, layer.in_features) / (layer.in_features + 4)
                return {"y": y, "excess": _excess(layer, linear, x, y, eps)}

            o.call(
                name,
                run,
                desc=f"Int8Linear({size.C}, {rows}) f32, x (2, 3, {size.C}), {size.name} sizes",
                stages=3,
                reduction=size.C,
                relations=[o.zero((name, "excess", ()), says="the scales' error bound")],
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
        cfg = _config(o, f"cfg{run}")
        gpt = _gpt(o, cfg, f"gpt{run}", dtype)
        ids = o.randint(cfg.V, 2, cfg.T, tag=f"ids{run}")  # (2, T)
        about = f"GPT V={cfg.V} T={cfg.T} C={cfg.C} H={cfg.H} L={cfg.L} d_ff={cfg.d_ff} {short}"
        red = max(cfg.T, cfg.C, cfg.d_ff)
        name = f"gpt/{short}"
        # 3.0: a float32 model's int8 layers compute in bfloat16 activations on a CPU
        computes = torch.bfloat16 if dtype == torch.float32 else None
        with torch.no_grad():
            o.call(
                name,
                partial(gpt, ids),
                desc=about,
                stages=16,
                reduction=red,
                computes_in=computes,
                axes=("config",),
            )
            o.call(
                f"{name}/again",
                partial(gpt, ids),
                desc=f"{about}, a second call",
                stages=16,
                reduction=red,
                axes=("history",),
                relations=[o.equal((name, "out", ()), (f"{name}/again", "out", ()))],
                computes_in=computes,
            )

            def chunks(gpt: GPT = gpt, ids: torch.Tensor = ids, n: int = 3 + run) -> torch.Tensor:
                use_kv_cache(gpt, 2)
                parts = [gpt(ids[:, p : p + n]) for p in range(0, ids.shape[1], n)]
                drop_kv_cache(gpt)
                return torch.cat(parts, dim=1)  # (2, T, V)

            o.call(
                f"{name}/cached",
                chunks,
                desc=f"{about}, cached chunks",
                stages=16,
                reduction=red,
                axes=("combos",),
                relations=[o.equal((name, "out", ()), (f"{name}/cached", "out", ()))],
                computes_in=computes,
            )
            fast = _gpt(o, cfg, f"gpt{run}", dtype)
            use_fast_attention(fast)
            o.call(
                f"{name}/fast",
                partial(fast, ids),
                desc=f"{about}, fast path",
                stages=16,
                reduction=red,
                computes_in=computes,
                axes=("combos",),
            )
            fresh = _gpt(o, cfg, f"other{run}", dtype)
            fresh.load_state_dict(gpt.state_dict())
            o.call(
                f"{name}/loaded",
                partial(fresh, ids),
                desc=f"{about}, state_dict loaded",
                stages=16,
                reduction=red,
                axes=("history",),
                relations=[o.equal((name, "out", ()), (f"{name}/loaded", "out", ()))],
                computes_in=computes,
            )
            mask = torch.ones(2, cfg.T, dtype=torch.bool)  # (2, T)
            mask[0, :5] = False
            o.call(
                f"{name}/padded",
                partial(padded_forward, gpt, ids, mask),
                desc=f"{about}, padded_forward, 5 pads in row 0",
                stages=16,
                reduction=red,
                computes_in=computes,
                axes=("combos",),
            )
        if dtype == torch.float64:
            o.call(
                f"{name}/generate",
                partial(generate, fast, ids[:, :9], 24, temperature=0),
                desc=f"{about}, fast path, greedy generate of 24",
                stages=1,
                reduction=1,
                axes=("combos",),
            )
        else:

            def autocast(gpt: GPT = gpt, ids: torch.Tensor = ids) -> torch.Tensor:
                with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
                    out: torch.Tensor = gpt(ids)  # (2, T, V)
                return out

            o.call(
                f"{name}/autocast",
                autocast,
                desc=f"{about}, bf16 autocast",
                stages=16,
                reduction=red,
                computes_in=torch.bfloat16,
                axes=("dtype", "combos"),
            )


def _errors(o: Oracle) -> None:
    """The documented bad inputs: each must raise what the base (or reference) raises."""
    cfg = ModelConfig(V=11, T=8, C=8, H=2, L=1, d_ff=8)
    twice = _gpt(o, cfg, "twice", torch.float32)
    o.call(
        "bad/already",
        partial(quantize_int8, twice),
        desc="a quantized model again",
        stages=1,
        reduction=1,
        axes=("errors",),
    )
    embedding: Any = nn.Embedding(4, 8)
    o.call(
        "bad/embedding",
        partial(quantize_linear, embedding),
        desc="nn.Embedding",
        stages=1,
        reduction=1,
        axes=("errors",),
    )
    layer = quantize_linear(nn.Linear(8, 4))
    x64 = o.randn(2, 8, tag="bad-x")  # (2, 8) float64 into a float32 layer
    o.call(
        "bad/dtype",
        partial(layer, x64),
        desc="float64 x into a float32 layer",
        stages=1,
        reduction=1,
        axes=("errors",),
    )
    ints = torch.ones(4, 8, dtype=torch.int32)
    o.call(
        "bad/weight",
        partial(quantize_weight, ints),
        desc="an int32 weight",
        stages=1,
        reduction=1,
        axes=("errors",),
    )
    o.call(
        "bad/width",
        partial(layer, o.randn(2, 7, tag="bad-w", dtype=torch.float32)),
        desc="x of width 7 into an 8-wide layer",
        stages=1,
        reduction=1,
        axes=("errors",),
    )


def calls(o: Oracle) -> None:
    """Every call of the quant stage's oracle."""
    _weights(o)
    _layer(o)
    _sizes(o)
    _models(o)
    _errors(o)
