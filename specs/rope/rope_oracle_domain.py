"""rope 1.4's domain sweeps (loaded by ``rope_oracle.calls``; calls ``domain/...``).

Each call names the spec's ``[oracle].axes`` it sweeps (``contracts check``
refuses the spec when one is never named). All compared with the base's
answers, in float64 unless the axis is the dtype:

- magnitude: ``q`` and ``k`` scaled by 1, 10, 30, 100, 1000 and 1e6 (the
  rotation is linear, so the relative bound holds at every scale), thetas
  from 2 to 1e8 and positions up to 65536;
- grad2: second derivatives of ``apply_rope`` (``autograd.grad`` with
  ``create_graph``, then the gradient of ``<g', v>``) with respect to q, k
  and the sin and cos tables;
- history: 2100 rotations with backward in one process, then one judged;
  tables of two sizes built in turn; a table changed in place by its caller
  not changing the next one built;
- modes, layout, dtype, config, errors: ``no_grad``, ``inference_mode``,
  ``enable_grad`` under ``no_grad``; transposed, strided and expanded q and k
  and sliced tables; float16 and bfloat16 tables and rotations, bfloat16
  autocast; head dims 2 and 512, length 1; bad calls raising as the base;
- size (rope 5.0): ``rope_cache`` and ``apply_rope`` in float32 at GPT-2
  small's T = 1024, D = 64 and H = 12 heads of one row, and at T, D and H
  drawn wide by the secret seed (``speckit.sizes``); judged by the reference.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from speckit import module_calls, sizes, sweeps

import niels_gpt.model.rope as rope

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle


SCALES = (1.0, 10.0, 30.0, 100.0, 1000.0, 1e6)
CALLS = 2100
F64 = torch.float64


def _sized(o: Oracle) -> module_calls.Sized:
    """``o`` with rope's sizing: a table or a rotation is two rounding stages deep (an angle's
    product, then its sine; a product, then a sum) and sums no more than two terms."""
    return module_calls.Sized(o, stages=2, reduction=2)


def _magnitude(o: Oracle) -> None:
    sized = _sized(o)
    sin, cos = rope.rope_cache(40, 16, theta=10000.0, dtype=F64)
    q0 = o.randn(2, 3, 40, 16, tag="mag-q")  # (B, H, T, D)
    k0 = o.randn(2, 3, 40, 16, tag="mag-k")  # (B, H, T, D)
    for s in SCALES:
        rotation = partial(rope.apply_rope, s * q0, s * k0, sin, cos)
        desc = f"apply_rope q,k (2, 3, 40, 16) f64 x{s:g}"
        sized.call(f"domain/magnitude/s={s:g}", rotation, desc=desc, axes=("magnitude",))
    for theta, t in ((2.0, 64), (1e8, 64), (10000.0, 65536)):
        table = partial(rope.rope_cache, t, 8, theta=theta, dtype=F64)
        desc = f"rope_cache(T={t}, D=8, theta={theta:g}, float64)"
        sized.call(f"domain/magnitude/theta={theta:g}/T={t}", table, desc=desc, axes=("magnitude",))


def _second(o: Oracle, tag: str, t: int, d: int) -> dict[str, Any]:
    sin, cos = rope.rope_cache(t + 3, d, theta=500.0, dtype=F64)
    wrt = [
        o.randn(2, 2, t, d, tag=f"{tag}-q").requires_grad_(True),  # (B, H, T, D)
        o.randn(2, 2, t, d, tag=f"{tag}-k").requires_grad_(True),  # (B, H, T, D)
        sin.clone().requires_grad_(True),  # (1, 1, T + 3, D/2)
        cos.clone().requires_grad_(True),  # (1, 1, T + 3, D/2)
    ]
    qr, kr = rope.apply_rope(*wrt)  # (B, H, T, D) each
    g = [o.randn(*y.shape, tag=f"{tag}-g{i}") for i, y in enumerate((qr, kr))]
    first = torch.autograd.grad((qr * g[0]).sum() + (kr * g[1]).sum(), wrt, create_graph=True)
    second = sweeps.hessian_vector(o, first, wrt, tag)
    names = ("q", "k", "sin", "cos")
    out: dict[str, Any] = {"q_rot": qr.detach(), "k_rot": kr.detach()}
    out.update({f"grad.{n}": f.detach() for n, f in zip(names, first, strict=True)})
    out.update({f"hvp.{n}": h for n, h in zip(names, second, strict=True)})
    return out


def _grad2(o: Oracle) -> None:
    for i, (t, d) in enumerate(((1, 2), (17, 8), (40, 32))):
        name = f"domain/grad2/{i}"
        o.call(
            name,
            partial(_second, o, name, t, d),
            stages=6,
            reduction=2 * t,
            desc=f"apply_rope q,k (2, 2, {t}, {d}) f64: Hessian-vector products (q, k, sin, cos)",
            axes=("grad2",),
        )


def _history(o: Oracle) -> None:
    if not o.wants("domain/history/after-many"):
        return
    sized = _sized(o)
    sin, cos = rope.rope_cache(8, 8, dtype=F64)
    q = o.randn(1, 2, 8, 8, tag="hist-q").requires_grad_(True)  # (1, 2, 8, 8)
    k = o.randn(1, 2, 8, 8, tag="hist-k")  # (1, 2, 8, 8)
    for _ in range(CALLS):
        qr, kr = rope.apply_rope(q, k, sin, cos)  # (1, 2, 8, 8) each
        torch.autograd.backward(qr.sum() + kr.sum())
    rotation = partial(rope.apply_rope, q.detach(), k, sin, cos)
    desc = f"apply_rope (1, 2, 8, 8) f64 after {CALLS} rotations with backward"
    sized.call("domain/history/after-many", rotation, desc=desc, axes=("history",))
    for i in range(3):  # two table sizes built in turn
        for t, d in ((16, 8), (33, 4)):
            table = partial(rope.rope_cache, t, d, dtype=F64)
            desc = f"rope_cache(T={t}, D={d}) f64, round {i} of building two in turn"
            sized.call(f"domain/history/tables/{i}/T={t}", table, desc=desc, axes=("history",))

    def mutated() -> Any:
        first = rope.rope_cache(12, 8, theta=77.0, dtype=F64)
        for table in first:
            table.mul_(3.0)  # the caller changes its tables in place
        return rope.rope_cache(12, 8, theta=77.0, dtype=F64)

    desc = "rope_cache(T=12, D=8, theta=77) f64 after the caller scaled an earlier one"
    sized.call("domain/history/after-in-place", mutated, desc=desc, axes=("history",))


def _modes_layout(o: Oracle) -> None:
    sized = _sized(o)
    sin, cos = rope.rope_cache(64, 16, theta=10000.0, dtype=F64)
    q = o.randn(2, 3, 20, 16, tag="modes-q")  # (B, H, T, D)
    k = o.randn(2, 3, 20, 16, tag="modes-k")  # (B, H, T, D)
    modes: dict[str, Any] = {
        "no_grad": torch.no_grad,
        "inference_mode": torch.inference_mode,
        "enable_grad": torch.enable_grad,
    }
    for mode, ctx in modes.items():

        def run(ctx: Any = ctx) -> Any:
            with torch.no_grad(), ctx():
                return rope.apply_rope(q, k, sin, cos)

        desc = f"apply_rope (2, 3, 20, 16) f64 {mode}"
        sized.call(f"domain/modes/{mode}", run, desc=desc, axes=("modes",))
    layouts = {
        "transposed": (o.randn(2, 20, 3, 16, tag="lay-q").transpose(1, 2), sin, cos),
        "strided": (o.randn(2, 3, 40, 16, tag="lay-s")[:, :, ::2], sin, cos),
        "expanded": (o.randn(1, 1, 20, 16, tag="lay-e").expand(2, 3, 20, 16), sin, cos),
        "tables-sliced": (q, sin[:, :, 5:], cos[:, :, 5:]),
        "head-dim-strided": (o.randn(2, 3, 20, 32, tag="lay-d")[..., ::2], sin, cos),
    }
    for what, (qq, s, c) in layouts.items():
        rotation = partial(rope.apply_rope, qq, k, s, c)
        desc = f"apply_rope, a {what} (non-contiguous) operand, f64"
        sized.call(f"domain/layout/{what}", rotation, desc=desc, axes=("layout",))


def _dtypes_configs(o: Oracle) -> None:
    sized = _sized(o)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        short = str(dtype).removeprefix("torch.")
        sin, cos = rope.rope_cache(24, 8, dtype=dtype)
        q = o.randn(1, 2, 24, 8, tag="dtype-q", dtype=dtype)  # (1, 2, 24, 8)
        rotation = partial(rope.apply_rope, q, q, sin, cos)
        desc = f"apply_rope (1, 2, 24, 8) {short} tables and q, k"
        sized.call(f"domain/dtype/{short}", rotation, desc=desc, axes=("dtype",))
    sin, cos = rope.rope_cache(24, 8, dtype=torch.float32)
    q = o.randn(1, 2, 24, 8, tag="dtype-q", dtype=torch.float32)  # (1, 2, 24, 8)

    def autocast() -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return rope.apply_rope(q, q, sin, cos)

    desc = "apply_rope float32 under bf16 autocast"
    name = "domain/dtype/autocast-bf16"
    sized.call(name, autocast, desc=desc, computes_in=torch.bfloat16, axes=("dtype",))
    for t, d, theta in ((1, 2, 10000.0), (5, 512, 10000.0), (300, 6, 3.5)):
        sin, cos = rope.rope_cache(t, d, theta=theta, dtype=F64)
        q = o.randn(1, 1, t, d, tag=f"config-q{d}")  # (1, 1, T, D)
        rotation = partial(rope.apply_rope, q, q, sin, cos)
        desc = f"apply_rope T={t} D={d} theta={theta:g} f64"
        sized.call(f"domain/config/T={t}/D={d}", rotation, desc=desc, axes=("config",))


def _errors(o: Oracle) -> None:
    sin, cos = rope.rope_cache(8, 4, dtype=torch.float32)
    q = o.randn(1, 2, 8, 4, tag="err-q", dtype=torch.float32)  # (1, 2, 8, 4)
    cases: dict[str, Any] = {
        "q-k-shapes": lambda: rope.apply_rope(q, q[:, :1], sin, cos),
        "head-dim": lambda: rope.apply_rope(q[..., :2], q[..., :2], sin, cos),
        "sin-cos-shapes": lambda: rope.apply_rope(q, q, sin, cos[:, :, :6]),
        "int-q": lambda: rope.apply_rope(q.long(), q.long(), sin, cos),
        "T-negative": lambda: rope.rope_cache(-3, 4),
        "D-zero": lambda: rope.rope_cache(8, 0),
        "theta-zero": lambda: rope.rope_cache(8, 4, theta=0.0),
        "int-dtype": lambda: rope.rope_cache(8, 4, dtype=torch.int64),
    }
    sweeps.errors(o, cases, "bad call")


def _sizes(o: Oracle) -> None:
    """``size``: a float32 table of ``T`` x ``D`` and one row of ``H`` heads rotated by it."""
    sized = _sized(o)
    for size in sizes.real_sizes(o, "size"):
        t, d, h, at = size.T, size.D, size.H, f"domain/size/{size.name}"
        desc = f"rope_cache(T={t}, D={d}) float32, {size.name} sizes"
        sized.call(f"{at}/cache", partial(rope.rope_cache, t, d), desc=desc, axes=("size",))
        if not o.wants(f"{at}/apply"):
            continue
        sin, cos = rope.rope_cache(t, d)  # (1, 1, T, D/2) float32 each
        q = o.randn(1, h, t, d, tag=f"size-q-{size.name}", dtype=torch.float32)  # (1, H, T, D)
        k = o.randn(1, h, t, d, tag=f"size-k-{size.name}", dtype=torch.float32)  # (1, H, T, D)
        desc = f"apply_rope q,k (1, {h}, {t}, {d}) float32, {size.name} sizes"
        rotation = partial(rope.apply_rope, q, k, sin, cos)
        sized.call(f"{at}/apply", rotation, desc=desc, axes=("size",))


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the rope stage's oracle."""
    _magnitude(o)
    _grad2(o)
    _history(o)
    _modes_layout(o)
    _dtypes_configs(o)
    _errors(o)
    _sizes(o)
