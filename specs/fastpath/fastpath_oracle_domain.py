"""The fastpath stage's domain sweeps (spec 3.4, issue 28; maintainer-owned).

``calls(o)`` runs after the driver's earlier calls (``fastpath_oracle.py``
chains it), one call group per axis the spec declares in
``[oracle].axes``; each call names the axis it sweeps (``contracts check``
refuses the spec when one is never named). The earlier calls already sweep
``combos`` (fast path x KV cache x positions x key mask, ``cached/...``) and
part of ``errors`` (``bad/...``), tagged there. Every fast answer is compared
with the base's and, as an invariant, with the explicit path's answer (``name/explicit``) on the
same weights and inputs (a fast module with ``use_explicit_attention``), in
float64 unless the axis is the dtype:

- magnitude: inputs and weights scaled by 1, 10, 30, 100 and 1000 (an
  attention module, and a GPT's weights); the bound's sum length covers the
  largest attention score;
- dtype: float32, float16 and bfloat16 modules, a float32 module and a GPT
  under bfloat16 autocast (forward and backward), float16 autocast;
- layout: transposed, strided and expanded inputs; ``sdpa_kernel`` itself on
  non-contiguous q, k, v;
- config: every ``ModelConfig`` field away from its default on a fast GPT;
- modes: train (dropout 0, then 0.3 judged by causality), eval, ``no_grad``,
  ``inference_mode``, ``enable_grad`` inside ``no_grad`` with a backward;
- grad2: Hessian-vector products of a fast module in training (input and
  every parameter) under SDPA's math backend: CPU's fused backward has no
  derivative of its own in torch (it raises on the base), so a user taking a
  gradient penalty through the fast path selects that backend, and the kernel
  (mask, scale, dropout rate) is then differentiated twice;
- history: one fast module after 3000 training calls (forward and backward),
  judged in eval and, in training, by causality; two modules called in turn;
  a fast GPT rebuilt from a saved ``state_dict``;
- errors: bad models for the switches and bad inputs to a fast module raise
  as the base raises them.
"""

from __future__ import annotations

import importlib.util
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import (
    FastCausalSelfAttention,
    sdpa_kernel,
    use_explicit_attention,
    use_fast_attention,
)
from niels_gpt.model.gpt import GPT

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

_SWEEPS = importlib.util.spec_from_file_location(  # the maintainers' oracle sweeps, by path
    "niels_speckit_sweeps", Path(__file__).parents[1] / "_kit" / "speckit_sweeps.py"
)
assert _SWEEPS is not None and _SWEEPS.loader is not None
sweeps = importlib.util.module_from_spec(_SWEEPS)
_SWEEPS.loader.exec_module(sweeps)

SCALES = (1.0, 10.0, 30.0, 100.0, 1000.0)
TRAINING_CALLS = 3000
ATTN = ModelConfig(V=2, T=40, C=16, H=2, dropout=0.0)
SMALL = ModelConfig(V=13, T=24, C=16, L=2, H=2, d_ff=24, dropout=0.0)
STAGES = 7 * SMALL.L + 2


def _attn(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype = torch.float64) -> Any:
    attn = FastCausalSelfAttention(cfg).to(dtype).eval()
    o.load_weights(attn, tag)
    return attn


def _gpt(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype = torch.float64) -> GPT:
    gpt = GPT(cfg).to(dtype).eval()
    o.load_weights(gpt, tag)
    use_fast_attention(gpt)
    return gpt


def _explicit(model: torch.nn.Module, fn: Any) -> Any:
    """``fn()`` with ``model``'s attention explicit, then fast again."""
    use_explicit_attention(model)
    try:
        return fn()
    finally:
        use_fast_attention(model)


def _vs_explicit(
    o: Oracle,
    name: str,
    model: torch.nn.Module,
    fn: Any,
    *,
    desc: str,
    stages: int,
    reduction: int,
    computes_in: torch.dtype | None = None,
) -> dict[str, Any]:
    """Call ``fn()`` on the explicit path as ``name/explicit``; return the keywords of the
    fast call ``name`` (the caller's ``o.call``, naming its axis): equal to it (an invariant)."""
    o.call(f"{name}/explicit", partial(_explicit, model, fn), desc=f"{desc}, explicit",
           stages=stages, reduction=reduction, computes_in=computes_in)  # fmt: skip
    return {
        "desc": f"{desc}, fast",
        "stages": stages,
        "reduction": reduction,
        "computes_in": computes_in,
        "relations": [o.equal((name, "out", ()), (f"{name}/explicit", "out", ()))],
    }


def _bound(attn: CausalSelfAttention, x: torch.Tensor) -> int:
    """An upper bound of ``|q . k| / sqrt(D)`` over every head and pair (RoPE keeps norms)."""
    with torch.no_grad():
        q, k, _ = attn.qkv(x).split(attn.cfg.C, dim=-1)  # (B, T, C) each
        top = q.norm(dim=-1).max() * k.norm(dim=-1).max() / attn.head_dim**0.5
    return int(top) + 1


def _gpt_bound(gpt: GPT, ids: torch.Tensor) -> int:
    """The largest ``_bound`` over ``gpt``'s attention modules, each on its own input."""
    top = 0
    with torch.no_grad():
        h = gpt.tok_emb(ids)  # (B, T, C): the first block's input
        for block in gpt.blocks:
            b = cast(Any, block)
            top = max(top, _bound(b.attn, b.ln1(h)))
            h = block(h)  # (B, T, C)
    return top


def _magnitude(o: Oracle) -> None:
    if not o.wants("domain/magnitude/attn/s=1"):
        return
    x0 = o.randn(2, 30, ATTN.C, tag="mag-x")  # (2, 30, C)
    ids = o.randint(SMALL.V, 2, 20, tag="mag-ids")  # (2, 20)
    for s in SCALES:
        attn = FastCausalSelfAttention(ATTN).double().eval()
        o.load_weights(attn, "mag-attn", scale=s / ATTN.C**0.5)  # weights x s
        x = s * x0  # (2, 30, C)
        gpt = GPT(SMALL).double().eval()
        o.load_weights(gpt, "mag-gpt", scale=s / SMALL.C**0.5)
        use_fast_attention(gpt)
        with torch.no_grad():
            o.call(
                f"domain/magnitude/attn/s={s:g}",
                partial(attn, x),
                axes=("magnitude",),
                **_vs_explicit(
                    o,
                    f"domain/magnitude/attn/s={s:g}",
                    attn,
                    partial(attn, x),
                    desc=f"attention B=2 T=30 f64, inputs and weights x{s:g}",
                    stages=4,
                    reduction=max(30, _bound(attn, x)),
                ),
            )
            o.call(
                f"domain/magnitude/gpt/s={s:g}",
                partial(gpt, ids),
                axes=("magnitude",),
                **_vs_explicit(
                    o,
                    f"domain/magnitude/gpt/s={s:g}",
                    gpt,
                    partial(gpt, ids),
                    desc=f"GPT B=2 T=20 f64, weights x{s:g}",
                    stages=STAGES,
                    reduction=max(SMALL.d_ff, SMALL.V, 20, _gpt_bound(gpt, ids)),
                ),
            )


def _autocast_backward(attn: Any, x: torch.Tensor) -> dict[str, Any]:
    attn.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attn(x)  # (B, T, C) bfloat16
    y.float().square().sum().backward()
    return {"out": y.detach(), **{n: p.grad for n, p in attn.named_parameters()}}


def _dtypes(o: Oracle) -> None:
    if not o.wants("domain/dtype/f32"):
        return
    x = o.randn(2, 30, ATTN.C, tag="dtype-x")  # (2, 30, C) float64
    with torch.no_grad():
        for dtype, short in (
            (torch.float32, "f32"),
            (torch.float16, "f16"),
            (torch.bfloat16, "bf16"),
        ):
            attn = _attn(o, ATTN, "dtype-w", dtype)
            o.call(
                f"domain/dtype/{short}",
                partial(attn, x.to(dtype)),
                axes=("dtype",),
                **_vs_explicit(
                    o,
                    f"domain/dtype/{short}",
                    attn,
                    partial(attn, x.to(dtype)),
                    desc=f"{short} attention B=2 T=30",
                    stages=4,
                    reduction=30,
                    computes_in=dtype,
                ),
            )
        attn = _attn(o, ATTN, "dtype-w", torch.float32)
        for dtype, short in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):

            def autocast(attn: Any = attn, dtype: torch.dtype = dtype) -> Any:
                with torch.autocast("cpu", dtype=dtype):
                    return attn(x.float())

            o.call(
                f"domain/dtype/autocast-{short}",
                autocast,
                axes=("dtype",),
                **_vs_explicit(
                    o,
                    f"domain/dtype/autocast-{short}",
                    attn,
                    autocast,
                    desc=f"f32 attention B=2 T=30 under {short} autocast",
                    stages=4,
                    reduction=30,
                    computes_in=dtype,
                ),
            )
        gpt = _gpt(o, SMALL, "dtype-gpt", torch.float32)
        ids = o.randint(SMALL.V, 2, 20, tag="dtype-ids")  # (2, 20)

        def gpt_autocast() -> Any:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return gpt(ids)

        o.call(
            "domain/dtype/gpt-autocast-bf16",
            gpt_autocast,
            axes=("dtype",),
            **_vs_explicit(
                o,
                "domain/dtype/gpt-autocast-bf16",
                gpt,
                gpt_autocast,
                desc="f32 GPT B=2 T=20 under bfloat16 autocast",
                stages=STAGES,
                reduction=24,
                computes_in=torch.bfloat16,
            ),
        )
    attn.train()
    o.call(
        "domain/dtype/autocast-bf16-backward",
        partial(_autocast_backward, attn, x.float()),
        axes=("dtype",),
        **_vs_explicit(
            o,
            "domain/dtype/autocast-bf16-backward",
            attn,
            partial(_autocast_backward, attn, x.float()),
            desc="f32 attention train under bfloat16 autocast, backward",
            stages=8,
            reduction=60,
            computes_in=torch.bfloat16,
        ),
    )


def _layout(o: Oracle) -> None:
    if not o.wants("domain/layout/transposed"):
        return
    attn = _attn(o, ATTN, "layout-w")
    inputs = {
        "transposed": o.randn(2, ATTN.C, 30, tag="layout-x").transpose(1, 2),  # (2, 30, C)
        "strided": o.randn(2, 60, ATTN.C, tag="layout-s")[:, ::2],  # (2, 30, C)
        "expanded": o.randn(1, 30, ATTN.C, tag="layout-e").expand(3, 30, ATTN.C),
    }
    with torch.no_grad():
        for what, x in inputs.items():
            o.call(
                f"domain/layout/{what}",
                partial(attn, x),
                axes=("layout",),
                **_vs_explicit(
                    o,
                    f"domain/layout/{what}",
                    attn,
                    partial(attn, x),
                    desc=f"{what} (non-contiguous) input, f64 eval",
                    stages=4,
                    reduction=30,
                ),
            )
    q = o.randn(2, 9, 2, 8, tag="layout-q").transpose(1, 2)  # (2, 2, 9, 8)
    k = o.randn(2, 2, 8, 13, tag="layout-k").transpose(2, 3)  # (2, 2, 13, 8)
    v = o.randn(13, 2, 2, 8, tag="layout-v").permute(1, 2, 0, 3)  # (2, 2, 13, 8)
    for what, kk, vv in (("square", k[:, :, :9], v[:, :, :9]), ("cached", k, v)):
        o.call(
            f"domain/layout/kernel-{what}",
            partial(sdpa_kernel, q, kk, vv, 0.0, 8**-0.5),
            desc=f"sdpa_kernel on non-contiguous q (2, 2, 9, 8), k and v {what}",
            stages=3,
            reduction=13,
            axes=("layout",),
        )


def _config(o: Oracle) -> None:
    if not o.wants("domain/config/V"):
        return
    for field, change, cfg in sweeps.config_changes(SMALL, sweeps.MODEL_FIELDS):
        gpt = _gpt(o, cfg, f"config-w-{field}")
        t = min(cfg.T, 30)
        z = o.randint(cfg.V, 2, t, tag=f"config-ids-{field}")  # (2, t)
        with torch.no_grad():
            o.call(
                f"domain/config/{field}",
                partial(gpt, z),
                axes=("config",),
                **_vs_explicit(
                    o,
                    f"domain/config/{field}",
                    gpt,
                    partial(gpt, z),
                    desc=f"fast GPT B=2 T={t} {field} = {change[field]} f64 eval",
                    stages=7 * cfg.L + 2,
                    reduction=max(cfg.d_ff, cfg.C, cfg.V, t),
                ),
            )


def _use() -> Any:
    """``fastpath_oracle_domain_use.py`` beside this file: modes, grad2, history, errors."""
    path = Path(__file__).with_name("fastpath_oracle_domain_use.py")
    spec = importlib.util.spec_from_file_location("_fastpath_oracle_domain_use", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the fastpath stage's oracle."""
    _magnitude(o)
    _dtypes(o)
    _layout(o)
    _config(o)
    _use().calls(o)
