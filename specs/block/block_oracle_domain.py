"""block 1.8's domain sweeps (loaded by ``block_oracle.calls``; calls ``domain/...``).

Each call names the spec's ``[oracle].axes`` it sweeps (``contracts check``
refuses the spec when one is never named). All compared with the base's
answers, in float64 unless the axis is the dtype:

- magnitude: inputs and weights both scaled by 1, 10, 30, 100 and 1000; the
  bound's sum length covers the largest attention score (exp turns a
  score's rounding, ``|s| u``, into a relative error of the probabilities);
- grad2: Hessian-vector products (``autograd.grad`` with ``create_graph``,
  then the gradient of ``<g', v>``) of ``Block`` and of ``MLP`` with respect
  to the input and every parameter: an activation whose second derivative
  is wrong shows here while its value and gradient agree;
- history: one block after 2100 training calls (forward and backward),
  judged in eval and, in training, by causality; two blocks called in turn;
  a block rebuilt from a saved ``state_dict``;
- modes, layout, dtype, config, errors: train and eval, ``no_grad``,
  ``inference_mode``, ``enable_grad`` under ``no_grad``; transposed, strided
  and expanded inputs; float32, float16 blocks and float16 autocast; each
  field the block reads (``H``, ``C``, ``d_ff``, ``T``, ``dropout``,
  ``rope_theta``) away from the default; bad inputs raising as the base.
"""

from __future__ import annotations

import dataclasses
import io
from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.block_v0 import MLP, Block

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

SCALES = (1.0, 10.0, 30.0, 100.0, 1000.0)
TRAINING_CALLS = 2100
SMALL = ModelConfig(V=2, T=32, C=16, H=2, d_ff=40, dropout=0.0)
STAGES = 7  # ln1, qkv, scores, probs @ v, proj, fc, proj


def _module(
    o: Oracle,
    cfg: ModelConfig,
    tag: str,
    dtype: torch.dtype = torch.float64,
    scale: float | None = None,
) -> Block:
    block = Block(cfg).to(dtype)
    o.load_weights(block, tag, scale)
    return block


def _score_bound(block: Block, x: torch.Tensor) -> int:
    """An upper bound of ``|q . k| / sqrt(D)`` over every head and pair (RoPE keeps norms)."""
    attn = block.attn
    with torch.no_grad():
        q, k, _ = attn.qkv(block.ln1(x)).split(attn.cfg.C, dim=-1)  # (B, T, C) each
        top = q.norm(dim=-1).max() * k.norm(dim=-1).max() / attn.head_dim**0.5
    return int(top) + 1


def _magnitude(o: Oracle) -> None:
    if not o.wants("domain/magnitude/s=1"):
        return
    x0 = o.randn(2, 24, SMALL.C, tag="mag-x")  # (2, 24, C)
    for s in SCALES:
        block = _module(o, SMALL, "mag-w", scale=s / SMALL.C**0.5).eval()  # weights x s
        x = s * x0  # (2, 24, C)
        n = max(SMALL.C, 24, _score_bound(block, x))
        with torch.no_grad():
            o.call(
                f"domain/magnitude/s={s:g}",
                partial(block, x, return_attn=True),
                desc=f"B=2 T=24 C=16 H=2 d_ff=40 f64 eval, inputs and weights x{s:g}",
                stages=STAGES,
                reduction=n,
                axes=("magnitude",),
            )


def _hvp(o: Oracle, block: torch.nn.Module, x: torch.Tensor, tag: str) -> dict[str, Any]:
    """``y``, the first-order input gradient, and H v for the input and every parameter."""
    x = x.clone().requires_grad_(True)  # (B, T, C)
    names, params = zip(*block.named_parameters(), strict=True)
    wrt = [x, *params]
    y = block(x)  # (B, T, C)
    g = o.randn(*y.shape, tag=f"{tag}-g")  # (B, T, C)
    first = torch.autograd.grad((y * g).sum(), wrt, create_graph=True)
    v = [o.randn(*t.shape, tag=f"{tag}-v{i}") for i, t in enumerate(wrt)]
    dot = torch.stack([(a * b).sum() for a, b in zip(first, v, strict=True)]).sum()  # ()
    second = torch.autograd.grad(dot, wrt, materialize_grads=True)
    out = {"y": y.detach(), "dx": first[0].detach(), "hvp.x": second[0]}
    out.update({f"hvp.{n}": h for n, h in zip(names, second[1:], strict=True)})
    return out


def _grad2(o: Oracle) -> None:
    for i, (b, t) in enumerate(((1, 1), (2, 17), (2, 32))):
        name = f"domain/grad2/{i}"
        if not o.wants(name):
            continue
        block = _module(o, SMALL, f"grad2-w{i}").train()
        x = o.randn(b, t, SMALL.C, tag=f"grad2-x{i}")  # (B, T, C)
        o.call(
            name,
            partial(_hvp, o, block, x, name),
            desc=f"B={b} T={t} C=16 H=2 d_ff=40 f64 train: Hessian-vector products (x, parameters)",
            stages=4 * STAGES,
            reduction=max(SMALL.C, b * t),
            axes=("grad2",),
        )
    if o.wants("domain/grad2/mlp"):
        mlp = MLP(SMALL).double()
        o.load_weights(mlp, "grad2-mlp")
        x = 2.0 * o.randn(2, 9, SMALL.C, tag="grad2-mlp-x")  # (2, 9, C): the activation's bend
        o.call(
            "domain/grad2/mlp",
            partial(_hvp, o, mlp, x, "domain/grad2/mlp"),
            desc="MLP on (2, 9, 16) f64: Hessian-vector products (x, parameters)",
            stages=8,
            reduction=SMALL.d_ff,
            axes=("grad2",),
        )


def _causal_pair(o: Oracle, block: Block, x: torch.Tensor, name: str, cut: int) -> None:
    """A train call and one with tokens ``cut..`` redrawn; the prefix must not move."""
    later = x.clone()  # (B, T, C)
    later[:, cut:] = o.randn(x.shape[0], x.shape[1] - cut, x.shape[2], tag=f"{name}-later")
    block.train()
    same = o.equal(
        (f"{name}/train", "out", ((1, 0, cut),)), (f"{name}/later", "out", ((1, 0, cut),))
    )
    for what, z, rel in (("train", x, ()), ("later", later, (same,))):
        o.call(
            f"{name}/{what}",
            partial(block, z),
            desc=f"B={x.shape[0]} T={x.shape[1]} C={x.shape[2]} f64 train"
            + (f", tokens {cut}.. redrawn" if rel else ""),
            stages=STAGES,
            reduction=max(x.shape[1], x.shape[2]),
            relations=rel,
            axes=("history",),
        )


def _history(o: Oracle) -> None:
    name = "domain/history/long"
    if not o.wants(f"{name}/eval"):
        return
    cfg = ModelConfig(V=2, T=8, C=8, H=2, d_ff=16, dropout=0.0)
    block = _module(o, cfg, "hist-w").train()
    x = o.randn(2, 8, 8, tag="hist-x")  # (2, 8, 8)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny ops: one thread is 3 to 8 times faster on a busy machine
    try:
        for _ in range(TRAINING_CALLS):  # one module's long training run (forward and backward)
            block(x).sum().backward()
    finally:
        torch.set_num_threads(threads)  # the judged calls run as a user's do
    block.eval()
    with torch.no_grad():
        o.call(
            f"{name}/eval",
            partial(block, x, return_attn=True),
            desc=f"B=2 T=8 C=8 H=2 f64 eval after {TRAINING_CALLS} training calls",
            stages=STAGES,
            reduction=8,
            axes=("history",),
        )
    _causal_pair(o, block, x, name, 3)
    saved = io.BytesIO()
    torch.save(block.state_dict(), saved)
    saved.seek(0)
    fresh = Block(cfg).double().eval()
    fresh.load_state_dict(torch.load(saved, weights_only=True))
    with torch.no_grad():
        o.call(
            "domain/history/reloaded",
            partial(fresh, x, return_attn=True),
            desc="B=2 T=8 C=8 H=2 f64 eval, a fresh module loaded from a saved state_dict",
            stages=STAGES,
            reduction=8,
            axes=("history",),
        )
    cfg2 = ModelConfig(V=2, T=16, C=12, H=3, d_ff=20, dropout=0.0, rope_theta=500.0)
    other = _module(o, cfg2, "hist-w2").train()
    y = o.randn(1, 16, 12, tag="hist-y")  # (1, 16, 12)
    for i in range(3):  # two models interleaved
        for who, m, z in (("a", block.train(), x), ("b", other, y)):
            o.call(
                f"domain/history/interleaved/{i}{who}",
                partial(m, z),
                desc=f"two modules called in turn, round {i}, module {who} f64 train",
                stages=STAGES,
                reduction=16,
                axes=("history",),
            )


def _enable_grad(block: Block, x: torch.Tensor) -> dict[str, Any]:
    with torch.no_grad(), torch.enable_grad():
        x = x.clone().requires_grad_(True)  # (B, T, C)
        y = block(x)  # (B, T, C)
        y.square().sum().backward()
    return {"y": y.detach(), "dx": x.grad}


def _modes_layout(o: Oracle) -> None:
    if not o.wants("domain/modes/train"):
        return
    block = _module(o, SMALL, "modes-w")
    x = o.randn(2, 20, SMALL.C, tag="modes-x")  # (2, 20, C)
    about = "B=2 T=20 C=16 H=2 d_ff=40 f64"
    modes: dict[str, tuple[bool, Any]] = {
        "train": (True, None),
        "eval": (False, None),
        "no_grad": (False, torch.no_grad),
        "inference_mode": (False, torch.inference_mode),
    }
    for mode, (training, ctx) in modes.items():
        block.train(training)

        def run(ctx: Any = ctx) -> Any:
            if ctx is None:
                return block(x, return_attn=True)
            with ctx():
                return block(x, return_attn=True)

        o.call(
            f"domain/modes/{mode}",
            run,
            desc=f"{about} {mode}",
            stages=STAGES,
            reduction=20,
            axes=("modes",),
        )
    o.call(
        "domain/modes/enable_grad",
        partial(_enable_grad, block.eval(), x),
        desc=f"{about} enable_grad inside no_grad, backward",
        stages=2 * STAGES,
        reduction=40,
        axes=("modes",),
    )
    layouts = {
        "transposed": o.randn(2, SMALL.C, 20, tag="layout-t").transpose(1, 2),  # (2, 20, C)
        "strided": o.randn(2, 40, SMALL.C, tag="layout-s")[:, ::2],  # (2, 20, C)
        "expanded": o.randn(1, 20, SMALL.C, tag="layout-e").expand(3, 20, SMALL.C),  # (3, 20, C)
        "channels-sliced": o.randn(2, 20, 2 * SMALL.C, tag="layout-c")[..., 1::2],  # (2, 20, C)
    }
    with torch.no_grad():
        for what, z in layouts.items():
            o.call(
                f"domain/layout/{what}",
                partial(block, z, return_attn=True),
                desc=f"{about} eval, a {what} (non-contiguous) input",
                stages=STAGES,
                reduction=20,
                axes=("layout",),
            )


def _dtypes_configs(o: Oracle) -> None:
    if not o.wants("domain/dtype/f32"):
        return
    x = o.randn(2, 20, SMALL.C, tag="dtype-x")  # (2, 20, C)
    for dtype, short in ((torch.float32, "f32"), (torch.float16, "f16")):
        block = _module(o, SMALL, "dtype-w", dtype).eval()
        with torch.no_grad():
            o.call(
                f"domain/dtype/{short}",
                partial(block, x.to(dtype), return_attn=True),
                desc=f"B=2 T=20 C=16 H=2 d_ff=40 {short} module eval",
                stages=STAGES,
                reduction=20,
                computes_in=dtype,
                axes=("dtype",),
            )
    block = _module(o, SMALL, "dtype-w", torch.float32).eval()

    def autocast() -> Any:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
            return block(x.float(), return_attn=True)

    o.call(
        "domain/dtype/autocast-f16",
        autocast,
        desc="B=2 T=20 C=16 H=2 d_ff=40 float16 autocast eval",
        stages=STAGES,
        reduction=20,
        computes_in=torch.float16,
        axes=("dtype",),
    )
    fields: dict[str, dict[str, Any]] = {
        "H": {"H": 4},
        "C": {"C": 24, "H": 3},
        "d_ff": {"d_ff": 7},
        "T": {"T": 48},
        "rope_theta": {"rope_theta": 123.0},
        "dropout": {"dropout": 0.3},
    }
    for field, change in fields.items():
        cfg = dataclasses.replace(SMALL, **change)
        block = _module(o, cfg, f"config-w-{field}")
        z = o.randn(2, min(cfg.T, 40), cfg.C, tag=f"config-x-{field}")  # (2, T, C)
        desc = f"B=2 T={z.shape[1]} C={cfg.C} H={cfg.H} cfg.T={cfg.T} dropout={cfg.dropout} "
        for mode in ("eval", "train"):
            block.train(mode == "train")
            o.call(
                f"domain/config/{field}/{mode}",
                partial(block, z, return_attn=True),
                desc=desc + f"theta={cfg.rope_theta:g} f64 {mode}",
                stages=STAGES,
                reduction=max(cfg.C, z.shape[1]),
                compare=("1",) if mode == "train" and cfg.dropout else None,
                axes=("config",),
            )


def _errors(o: Oracle) -> None:
    block = _module(o, SMALL, "errors-w", torch.float32).eval()
    cases = {
        "device-meta": torch.zeros(1, 4, SMALL.C, device="meta"),
        "int64": torch.zeros(1, 4, SMALL.C, dtype=torch.int64),
        "float16": torch.zeros(1, 4, SMALL.C, dtype=torch.float16),
        "rank4": torch.zeros(1, 1, 4, SMALL.C),
        "rank1": torch.zeros(SMALL.C),
        "length": torch.zeros(1, SMALL.T + 1, SMALL.C),
        "width": torch.zeros(1, 4, SMALL.C + 1),
    }
    for what, z in cases.items():
        o.call(
            f"domain/errors/{what}",
            partial(block, z),
            desc=f"bad input: {what}",
            stages=1,
            reduction=1,
            axes=("errors",),
        )


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the block stage's oracle."""
    _magnitude(o)
    _grad2(o)
    _history(o)
    _modes_layout(o)
    _dtypes_configs(o)
    _errors(o)
