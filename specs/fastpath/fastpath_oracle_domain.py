"""The fastpath stage's domain sweeps (loaded by ``fastpath_oracle.calls``; ``domain/...``).

Each call names the spec's ``[oracle].axes`` it sweeps (``contracts check``
refuses the spec when one is never named). The earlier calls already sweep
``combos`` (fast path x KV cache x positions x key mask, ``cached/...``) and
part of ``errors`` (``bad/...``), tagged there. Every fast answer is compared
with the base's and, as an invariant, with the explicit path's answer
(``name/explicit``) on the same weights and inputs (a fast module with
``use_explicit_attention``), in float64 unless the axis is the dtype. The
model sweep's table (``speckit.model_sweeps``) calls a fast
``GPT`` so: weights scaled up to x1000, every ``ModelConfig`` field away from
its default, bad models for the switches and bad inputs to a fast module
raising as the base. What is the fast attention module's own:

- magnitude: inputs and weights scaled by the same factors; the bound's sum
  length covers the largest attention score;
- dtype: float32, float16 and bfloat16 modules, a float32 module and a GPT
  under bfloat16 autocast (forward and backward), float16 autocast;
- layout: transposed, strided and expanded inputs; ``sdpa_kernel`` itself on
  non-contiguous q, k, v;
- modes: train (dropout 0, then 0.3 judged by causality), eval, ``no_grad``,
  ``inference_mode``, ``enable_grad`` inside ``no_grad`` with a backward;
- grad2: Hessian-vector products of a fast module in training (input and
  every parameter) under SDPA's math backend: CPU's fused backward has no
  derivative of its own in torch (it raises on the base), so a user taking a
  gradient penalty through the fast path selects that backend, and the kernel
  (mask, scale, dropout rate) is then differentiated twice;
- history: one fast module after 3000 training calls (forward and backward),
  judged in eval and, in training, by causality; two modules called in turn;
  a fast GPT rebuilt from a saved ``state_dict``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
from speckit import model_sweeps as sweeps
from speckit.module_sweeps import scaled
from torch.nn.attention import SDPBackend
from torch.nn.attention import sdpa_kernel as backends

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


TRAINING_CALLS = 3000
ATTN = ModelConfig(V=2, T=40, C=16, H=2, dropout=0.0)
SMALL = ModelConfig(V=13, T=24, C=16, L=2, H=2, d_ff=24, dropout=0.0)
STAGES = sweeps.depth(SMALL)
OWN = sweeps.Scenarios()  # the stage's own scenarios by axis, run after the table's


def _attn(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype = torch.float64) -> Any:
    attn = FastCausalSelfAttention(cfg).to(dtype).eval()
    o.load_weights(attn, tag)
    return attn


def _explicit(model: torch.nn.Module, fn: Any) -> Any:
    """``fn()`` with ``model``'s attention explicit, then fast again."""
    use_explicit_attention(model)
    try:
        return fn()
    finally:
        use_fast_attention(model)


def _explicit_and_fast(o: Oracle, name: str, model: torch.nn.Module, fn: Any) -> list[Any]:
    """``fn()`` on the explicit path (``name/explicit``) and on the fast one (``name``),
    equal to each other (an invariant)."""
    same = o.equal((name, "out", ()), (f"{name}/explicit", "out", ()))
    return [
        sweeps.Call("/explicit", partial(_explicit, model, fn), "{}, explicit"),
        sweeps.Call("", fn, "{}, fast", {"relations": [same]}),
    ]


def _forward(o: Oracle, name: str, gpt: GPT, ids: torch.Tensor) -> list[Any]:
    """The table's forward: ``gpt(ids)`` explicit and fast (``_explicit_and_fast``)."""
    return _explicit_and_fast(o, name, gpt, partial(gpt, ids))


def _both(o: Oracle, name: str, model: torch.nn.Module, fn: Any, desc: str, **judged: Any) -> None:
    """A scenario's ``fn()`` explicit and fast, judged alike (``sweeps.judge``'s keywords)."""
    sweeps.judge(o, name, _explicit_and_fast(o, name, model, fn), desc, **judged)


@OWN.axis("magnitude", "domain/magnitude/attn/s=1")
def _magnitude(o: Oracle) -> None:
    x0 = o.randn(2, 30, ATTN.C, tag="mag-x")  # (2, 30, C)
    for s, attn, x in scaled(o, partial(FastCausalSelfAttention, ATTN), x0, "mag-attn"):
        top = max(30, sweeps.score_bound(attn, x))
        with torch.no_grad():
            _both(o, f"domain/magnitude/attn/s={s:g}", attn, partial(attn, x),
                  f"attention B=2 T=30 f64, inputs and weights x{s:g}", stages=4,
                  reduction=top, axes=("magnitude",))  # fmt: skip


def _autocast_backward(attn: Any, x: torch.Tensor) -> dict[str, Any]:
    attn.zero_grad()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = attn(x)  # (B, T, C) bfloat16
    y.float().square().sum().backward()
    return {"out": y.detach(), **{n: p.grad for n, p in attn.named_parameters()}}


@OWN.axis("dtype", "domain/dtype/f32")
def _dtypes(o: Oracle) -> None:
    x = o.randn(2, 30, ATTN.C, tag="dtype-x")  # (2, 30, C) float64
    axes = ("dtype",)
    with torch.no_grad():
        for dtype, short in ((torch.float32, "f32"), (torch.float16, "f16"),
                             (torch.bfloat16, "bf16")):  # fmt: skip
            attn = _attn(o, ATTN, "dtype-w", dtype)
            _both(o, f"domain/dtype/{short}", attn, partial(attn, x.to(dtype)),
                  f"{short} attention B=2 T=30", stages=4, reduction=30, axes=axes,
                  computes_in=dtype)  # fmt: skip
        attn = _attn(o, ATTN, "dtype-w", torch.float32)
        for dtype, short in ((torch.bfloat16, "bf16"), (torch.float16, "f16")):

            def autocast(attn: Any = attn, dtype: torch.dtype = dtype) -> Any:
                with torch.autocast("cpu", dtype=dtype):
                    return attn(x.float())

            _both(o, f"domain/dtype/autocast-{short}", attn, autocast,
                  f"f32 attention B=2 T=30 under {short} autocast", stages=4, reduction=30,
                  axes=axes, computes_in=dtype)  # fmt: skip
        gpt = sweeps.model(o, TABLE, SMALL, "dtype-gpt", torch.float32)
        ids = o.randint(SMALL.V, 2, 20, tag="dtype-ids")  # (2, 20)

        def gpt_autocast() -> Any:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return gpt(ids)

        _both(o, "domain/dtype/gpt-autocast-bf16", gpt, gpt_autocast,
              "f32 GPT B=2 T=20 under bfloat16 autocast", stages=STAGES, reduction=24,
              axes=axes, computes_in=torch.bfloat16)  # fmt: skip
    attn.train()
    _both(o, "domain/dtype/autocast-bf16-backward", attn,
          partial(_autocast_backward, attn, x.float()),
          "f32 attention train under bfloat16 autocast, backward", stages=8, reduction=60,
          axes=axes, computes_in=torch.bfloat16)  # fmt: skip


@OWN.axis("layout", "domain/layout/transposed")
def _layout(o: Oracle) -> None:
    attn = _attn(o, ATTN, "layout-w")
    inputs = {
        "transposed": o.randn(2, ATTN.C, 30, tag="layout-x").transpose(1, 2),  # (2, 30, C)
        "strided": o.randn(2, 60, ATTN.C, tag="layout-s")[:, ::2],  # (2, 30, C)
        "expanded": o.randn(1, 30, ATTN.C, tag="layout-e").expand(3, 30, ATTN.C),
    }
    with torch.no_grad():
        for what, x in inputs.items():
            _both(o, f"domain/layout/{what}", attn, partial(attn, x),
                  f"{what} (non-contiguous) input, f64 eval", stages=4, reduction=30,
                  axes=("layout",))  # fmt: skip
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


def _backward(attn: Any, x: torch.Tensor) -> dict[str, Any]:
    attn.zero_grad()
    z = x.clone().requires_grad_(True)  # (B, T, C)
    y = attn(z)  # (B, T, C)
    y.square().sum().backward()
    return {"out": y.detach(), "dx": z.grad, **{n: p.grad for n, p in attn.named_parameters()}}


@OWN.axis("modes", "domain/modes/eval")
def _modes(o: Oracle) -> None:
    attn = _attn(o, ATTN, "modes-w")
    x = o.randn(2, 30, ATTN.C, tag="modes-x")  # (2, 30, C)
    axes = ("modes",)
    for mode, ctx in (("eval", None), ("no_grad", torch.no_grad),
                      ("inference_mode", torch.inference_mode)):  # fmt: skip
        desc = "f64 eval" + (f" under {mode}" if ctx else "")
        with ctx() if ctx else contextlib.nullcontext():
            _both(o, f"domain/modes/{mode}", attn, partial(attn, x), desc, stages=4,
                  reduction=30, axes=axes)  # fmt: skip
    attn.train()  # dropout 0: training mode, nothing random
    _both(o, "domain/modes/train", attn, partial(_backward, attn, x), "f64 train, backward",
          stages=8, reduction=60, axes=axes)  # fmt: skip
    with torch.no_grad():

        def enabled() -> Any:
            with torch.enable_grad():
                return _backward(attn.eval(), x)

        _both(o, "domain/modes/enable_grad", attn, enabled,
              "f64 eval, enable_grad inside no_grad, backward", stages=8, reduction=60,
              axes=axes)  # fmt: skip
    drop = _attn(o, dataclasses.replace(ATTN, dropout=0.3), "modes-drop").train()
    later = x.clone()  # (2, 30, C)
    later[:, 12:] = 100.0 * o.randn(2, 18, ATTN.C, tag="modes-far")
    sweeps.causal_pair(
        o,
        ("domain/modes/dropout", "domain/modes/dropout-later"),
        (partial(drop, x), partial(drop, later)),
        12,
        desc=("f64 train, dropout 0.3", "f64 train, dropout 0.3, inputs 12.. x100"),
        stages=4,
        reduction=30,
        compare=(),
        axes=axes,
    )


def _hvp(o: Oracle, attn: Any, x: torch.Tensor, tag: str) -> dict[str, Any]:
    """``y``, the input gradient and H v for the input and every parameter (math backend)."""
    with backends([SDPBackend.MATH]):  # a non-leaf input (FLOP counting's module hooks)
        return dict(sweeps.output_hvp(o, attn, x, tag, out="out", feed=lambda z: z * 1.0))


@OWN.axis("grad2", "domain/grad2/attn")
def _grad2(o: Oracle) -> None:
    attn = _attn(o, ATTN, "grad2-w").train()
    x = 2.0 * o.randn(2, 17, ATTN.C, tag="grad2-x")  # (2, 17, C)
    name, fn = "domain/grad2/attn", partial(_hvp, o, attn, x, "grad2")
    explicit, fast = _explicit_and_fast(o, name, attn, fn)
    desc = "fast attention B=2 T=17 f64 train: H v (x, parameters), SDPA math backend"
    sweeps.judge(o, name, [explicit], desc, stages=4 * 4, reduction=40, axes=("grad2",))
    o.call(name, fast.fn, desc=fast.says.format(desc), stages=4 * 4, reduction=40,
           axes=("grad2",), **fast.extra)  # fmt: skip


@OWN.axis("history", "domain/history/long/eval")
def _history(o: Oracle) -> None:
    cfg = ModelConfig(V=2, T=8, C=8, H=2, dropout=0.0)
    attn = _attn(o, cfg, "hist-w").train()
    x = o.randn(2, 8, 8, tag="hist-x")  # (2, 8, 8)

    def warm_up() -> None:
        for _ in range(TRAINING_CALLS):  # one fast module's long training run
            attn(x).square().mean().backward()

    sweeps.one_thread(warm_up)
    attn.eval()
    with torch.no_grad():
        _both(o, "domain/history/long/eval", attn, partial(attn, x),
              f"fast attention f64 eval after {TRAINING_CALLS} training calls", stages=4,
              reduction=8, axes=("history",))  # fmt: skip
    attn.train()
    later = x.clone()  # (2, 8, 8)
    later[:, 3:] += 1.0
    sweeps.causal_pair(
        o,
        ("domain/history/long/train", "domain/history/long/later"),
        (partial(attn, x), partial(attn, later)),
        3,
        desc=("f64 train after the long run", "f64 train after the long run, inputs 3.. changed"),
        stages=4,
        reduction=8,
        axes=("history",),
    )
    gpt = sweeps.model(o, TABLE, SMALL, "hist-gpt")
    fresh = sweeps.reloaded(TABLE, gpt, SMALL)
    ids = o.randint(SMALL.V, 2, 20, tag="hist-ids")  # (2, 20)
    same = o.equal(("domain/history/reloaded", "out", ()), ("domain/history/saved", "out", ()))
    pair = [  # the fresh model equal to the saved one (an invariant)
        sweeps.Call("/reloaded", partial(fresh, ids), "fast GPT loaded from a saved state_dict, {}",
                    {"relations": [same]}),
        sweeps.Call("/saved", partial(gpt, ids), "the fast GPT that was saved, {}"),
    ]  # fmt: skip
    with torch.no_grad():
        sweeps.judge(o, "domain/history", pair, "f64 eval", stages=STAGES, reduction=24,
                     axes=("history",))  # fmt: skip
    other = _attn(o, dataclasses.replace(cfg, C=12, H=3, T=16), "hist-w2")
    sweeps.in_turn(
        o,
        (attn, x),
        (other, o.randn(1, 16, 12, tag="hist-x2")),  # (1, 16, 12)
        lambda m, z, _: partial(m, z),
        desc="two fast modules called in turn, round {round}, module {who}",
        stages=4,
        reduction=16,
    )


class _Own(CausalSelfAttention):
    """A subclass of the attention the fast path does not know."""


def _errors(o: Oracle) -> dict[str, Any]:
    attn = _attn(o, ATTN, "errors-w", torch.float32)
    x = torch.zeros(1, 4, ATTN.C)  # (1, 4, C)
    q = torch.zeros(1, 2, 5, 8)  # (1, 2, 5, 8)
    return {
        "fast-unknown-subclass": partial(use_fast_attention, _Own(ATTN)),
        "explicit-unknown-subclass": partial(use_explicit_attention, _Own(ATTN)),
        "explicit-not-a-module": partial(use_explicit_attention, cast(Any, "gpt")),
        "x-rank2": partial(attn, x[0]),
        "x-width": partial(attn, x[..., :8]),
        "x-too-long": partial(attn, torch.zeros(1, 41, ATTN.C)),
        "x-empty": partial(attn, x[:, :0]),
        "x-float64": partial(attn, x.double()),
        "x-int": partial(attn, x.long()),
        "x-meta": partial(attn, x.to("meta")),
        "kernel-fewer-keys": partial(sdpa_kernel, q, q[:, :, :3], q[:, :, :3], 0.0, 1.0),
    }


TABLE = sweeps.ModelSweep(
    build=lambda cfg: use_fast_attention(GPT(cfg)),
    small=SMALL,
    forward=_forward,
    suffixes=("", "/explicit"),
    label="fast GPT",
    part="gpt/",
    errors=_errors,
    scenarios=OWN,
)


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the fastpath stage's oracle."""
    sweeps.model_sweeps(o, TABLE)
