"""backbone_v1 5.0's domain sweeps (loaded by ``backbone_v1_oracle.calls``; ``domain/...``).

Each call names the spec's ``[oracle].axes`` it sweeps (``contracts check``
refuses the spec when one is never named). All compared with the base's
answers, in float64 unless the axis is the dtype:

- magnitude: ``GPT`` weights and a ``Block``'s inputs and weights scaled by
  1, 10, 30, 100 and 1000; the bound's sum length covers the largest
  attention score (exp turns a score's rounding, ``|s| u``, into a relative
  error of the probabilities);
- grad2: Hessian-vector products (``autograd.grad`` with ``create_graph``,
  then the gradient of ``<g', v>``) of ``Block``, ``MLP`` and ``RMSNorm``
  with respect to the input and every parameter, and of ``GPT``'s
  cross-entropy loss with respect to every parameter;
- history: one model after 2100 training calls (forward and backward),
  judged in eval and, in training, by causality; two models called in turn;
  a model rebuilt from a saved ``state_dict``;
- modes, layout, dtype, config, errors: train and eval, ``no_grad``,
  ``inference_mode``, ``enable_grad`` under ``no_grad``; non-contiguous ids
  and block inputs; float32, float16 models and float16 autocast; every
  ``ModelConfig`` field away from the default; bad inputs raising as the base.

The second derivatives, the one-thread warm-up and the bad calls are the
maintainers' kit's (``specs/_kit/speckit_sweeps.py``, loaded by path).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F

from niels_gpt.config import ModelConfig
from niels_gpt.model.blocks import MLP, Block, RMSNorm
from niels_gpt.model.gpt import GPT

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

_SWEEPS = importlib.util.spec_from_file_location(  # the maintainers' oracle sweeps, by path
    "niels_speckit_sweeps", Path(__file__).parents[1] / "_kit" / "speckit_sweeps.py"
)
assert _SWEEPS is not None and _SWEEPS.loader is not None
sweeps = importlib.util.module_from_spec(_SWEEPS)
_SWEEPS.loader.exec_module(sweeps)
SCALES = sweeps.SCALES
TRAINING_CALLS = sweeps.TRAINING_CALLS
SMALL = ModelConfig(V=11, T=24, C=16, L=2, H=2, d_ff=24, dropout=0.0)
STAGES = 7 * SMALL.L + 2


def _gpt(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype = torch.float64) -> GPT:
    gpt = GPT(cfg).to(dtype)
    o.load_weights(gpt, tag)
    return gpt


def _score_bound(block: Block, x: torch.Tensor) -> int:
    """An upper bound of ``|q . k| / sqrt(D)`` over every head and pair (RoPE keeps norms)."""
    attn = block.attn
    with torch.no_grad():
        q, k, _ = attn.qkv(block.ln1(x)).split(attn.cfg.C, dim=-1)  # (B, T, C) each
        top = q.norm(dim=-1).max() * k.norm(dim=-1).max() / attn.head_dim**0.5
    return int(top) + 1


def _gpt_bound(gpt: GPT, ids: torch.Tensor) -> int:
    """The largest ``_score_bound`` over ``gpt``'s blocks, each on its own input."""
    top = 0
    with torch.no_grad():
        h = gpt.tok_emb(ids)  # (B, T, C): the first block's input
        for block in gpt.blocks:
            top = max(top, _score_bound(block, h))  # type: ignore[arg-type]
            h = block(h)  # (B, T, C)
    return top


def _magnitude(o: Oracle) -> None:
    if not o.wants("domain/magnitude/block/s=1"):
        return
    x0 = o.randn(2, 20, SMALL.C, tag="mag-x")  # (2, 20, C)
    ids = o.randint(SMALL.V, 2, 20, tag="mag-ids")  # (2, 20)
    for s in SCALES:
        block = Block(SMALL).double().eval()
        o.load_weights(block, "mag-block", scale=s / SMALL.C**0.5)  # weights x s
        x = s * x0  # (2, 20, C)
        n = max(SMALL.d_ff, 20, _score_bound(block, x))
        gpt = GPT(SMALL).double().eval()
        o.load_weights(gpt, "mag-gpt", scale=s / SMALL.C**0.5)
        m = max(SMALL.d_ff, SMALL.V, 20, _gpt_bound(gpt, ids))
        with torch.no_grad():
            o.call(
                f"domain/magnitude/block/s={s:g}",
                partial(block, x, return_attn=True),
                desc=f"Block B=2 T=20 C=16 f64 eval, inputs and weights x{s:g}",
                stages=7,
                reduction=n,
                axes=("magnitude",),
            )
            o.call(
                f"domain/magnitude/gpt/s={s:g}",
                partial(gpt, ids),
                desc=f"GPT B=2 T=20 C=16 L=2 f64 eval, weights x{s:g}",
                stages=STAGES,
                reduction=m,
                axes=("magnitude",),
            )


def _loss_hvp(o: Oracle, gpt: GPT, ids: torch.Tensor, tag: str) -> dict[str, Any]:
    """The cross-entropy loss, its parameter gradient, and H v over every parameter."""
    logits = gpt(ids)  # (B, T, V)
    targets = o.randint(gpt.cfg.V, *ids.shape, tag=f"{tag}-targets")  # (B, T)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())  # ()
    return dict(sweeps.loss_hvp(o, loss, list(gpt.named_parameters()), tag))


def _grad2(o: Oracle) -> None:
    parts: dict[str, torch.nn.Module] = {
        "block": Block(SMALL),
        "mlp": MLP(SMALL),
        "rmsnorm": RMSNorm(SMALL.C),
    }
    for part, module in parts.items():
        name = f"domain/grad2/{part}"
        if not o.wants(name):
            continue
        module.double().train()
        o.load_weights(module, f"grad2-{part}")
        x = 2.0 * o.randn(2, 13, SMALL.C, tag=f"grad2-x-{part}")  # (2, 13, C)
        o.call(
            name,
            partial(sweeps.output_hvp, o, module, x, name),
            desc=f"{part} on (2, 13, 16) f64: Hessian-vector products (x, parameters)",
            stages=4 * 7,
            reduction=max(SMALL.d_ff, 26),
            axes=("grad2",),
        )
    if o.wants("domain/grad2/gpt-loss"):
        gpt = _gpt(o, SMALL, "grad2-gpt").train()
        ids = o.randint(SMALL.V, 2, 13, tag="grad2-ids")  # (2, 13)
        o.call(
            "domain/grad2/gpt-loss",
            partial(_loss_hvp, o, gpt, ids, "grad2-gpt"),
            desc="GPT B=2 T=13 C=16 L=2 f64 cross-entropy: Hessian-vector products (parameters)",
            stages=4 * STAGES,
            reduction=max(SMALL.d_ff, SMALL.V, 26),
            axes=("grad2",),
        )


def _history(o: Oracle) -> None:
    name = "domain/history/long"
    if not o.wants(f"{name}/eval"):
        return
    cfg = ModelConfig(V=5, T=8, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    gpt = _gpt(o, cfg, "hist-w").train()
    ids = o.randint(cfg.V, 2, 8, tag="hist-ids")  # (2, 8)

    def training_run() -> None:
        for _ in range(TRAINING_CALLS):  # one model's long training run (forward and backward)
            gpt(ids).sum().backward()

    sweeps.one_thread(training_run)
    gpt.eval()
    with torch.no_grad():
        o.call(
            f"{name}/eval",
            partial(gpt, ids),
            stages=9,
            reduction=8,
            axes=("history",),
            desc=f"GPT B=2 T=8 C=8 L=1 f64 eval after {TRAINING_CALLS} training calls",
        )
    gpt.train()
    later = ids.clone()  # (2, 8)
    later[:, 3:] = (ids[:, 3:] + 1) % cfg.V
    same = o.equal((f"{name}/train", "out", ((1, 0, 3),)), (f"{name}/later", "out", ((1, 0, 3),)))
    for what, z, rel in (("train", ids, ()), ("later", later, (same,))):
        o.call(
            f"{name}/{what}",
            partial(gpt, z),
            stages=9,
            reduction=8,
            relations=rel,
            desc=f"GPT B=2 T=8 f64 train after the long run{', ids 3.. changed' if rel else ''}",
            axes=("history",),
        )
    saved = io.BytesIO()
    torch.save(gpt.state_dict(), saved)
    saved.seek(0)
    fresh = GPT(cfg).double().eval()
    fresh.load_state_dict(torch.load(saved, weights_only=True))
    with torch.no_grad():
        o.call(
            "domain/history/reloaded",
            partial(fresh, ids),
            stages=9,
            reduction=8,
            desc="GPT B=2 T=8 f64 eval, a fresh model loaded from a saved state_dict",
            axes=("history",),
        )
    other = _gpt(o, dataclasses.replace(cfg, V=7, C=12, H=3, T=16), "hist-w2").train()
    ids2 = o.randint(7, 1, 16, tag="hist-ids2")  # (1, 16)
    for i in range(3):  # two models interleaved
        for who, m, z in (("a", gpt, ids), ("b", other, ids2)):
            o.call(
                f"domain/history/interleaved/{i}{who}",
                partial(m, z),
                stages=9,
                reduction=16,
                axes=("history",),
                desc=f"two models called in turn, round {i}, model {who} f64 train",
            )


def _enable_grad(gpt: GPT, ids: torch.Tensor) -> dict[str, Any]:
    with torch.no_grad(), torch.enable_grad():
        gpt.zero_grad()
        y = gpt(ids)  # (B, T, V)
        y.square().sum().backward()
    return {"y": y.detach(), **{n: p.grad for n, p in gpt.named_parameters()}}


def _modes_layout(o: Oracle) -> None:
    if not o.wants("domain/modes/train"):
        return
    gpt = _gpt(o, SMALL, "modes-w")
    ids = o.randint(SMALL.V, 2, 20, tag="modes-ids")  # (2, 20)
    about = "GPT B=2 T=20 C=16 L=2 f64"
    trace = partial(gpt.forward_with_attn_trace, ids, 1, True)
    sweeps.modes(o, gpt, trace, about + " {mode} trace", stages=STAGES, reduction=20)
    o.call(
        "domain/modes/enable_grad",
        partial(_enable_grad, gpt.eval(), ids),
        desc=f"{about} enable_grad inside no_grad, backward",
        stages=2 * STAGES,
        reduction=40,
        axes=("modes",),
    )
    block = Block(SMALL).double().eval()
    o.load_weights(block, "layout-block")
    inputs = {
        "ids-transposed": o.randint(SMALL.V, 20, 2, tag="layout-ids").t(),  # (2, 20)
        "ids-strided": o.randint(SMALL.V, 2, 40, tag="layout-ids2")[:, ::2],  # (2, 20)
        "block-transposed": o.randn(2, SMALL.C, 20, tag="layout-x").transpose(1, 2),
        "block-expanded": o.randn(1, 20, SMALL.C, tag="layout-e").expand(3, 20, SMALL.C),
    }
    with torch.no_grad():
        for what, z in inputs.items():
            fn = partial(gpt, z) if what.startswith("ids") else partial(block, z)
            o.call(
                f"domain/layout/{what}",
                fn,
                desc=f"{what} (non-contiguous) input, f64 eval",
                stages=STAGES,
                reduction=20,
                axes=("layout",),
            )


def _dtypes_configs(o: Oracle) -> None:
    if not o.wants("domain/dtype/f32"):
        return
    ids = o.randint(SMALL.V, 2, 20, tag="dtype-ids")  # (2, 20)
    for dtype, short in ((torch.float32, "f32"), (torch.float16, "f16")):
        gpt = _gpt(o, SMALL, "dtype-w", dtype).eval()
        with torch.no_grad():
            o.call(
                f"domain/dtype/{short}",
                partial(gpt, ids),
                computes_in=dtype,
                desc=f"GPT B=2 T=20 C=16 L=2 {short} model eval",
                stages=STAGES,
                reduction=20,
                axes=("dtype",),
            )
    gpt = _gpt(o, SMALL, "dtype-w", torch.float32).eval()

    def autocast() -> Any:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
            return gpt.forward_with_attn_trace(ids, 0, True)

    o.call(
        "domain/dtype/autocast-f16",
        autocast,
        computes_in=torch.float16,
        desc="GPT B=2 T=20 C=16 L=2 float16 autocast eval trace",
        stages=STAGES,
        reduction=20,
        axes=("dtype",),
    )
    for field, change, cfg in sweeps.config_changes(SMALL, sweeps.MODEL_FIELDS):
        gpt = _gpt(o, cfg, f"config-w-{field}").eval()
        z = o.randint(cfg.V, 2, min(cfg.T, 30), tag=f"config-ids-{field}")  # (2, t)
        with torch.no_grad():
            o.call(
                f"domain/config/{field}",
                partial(gpt, z),
                stages=7 * cfg.L + 2,
                reduction=max(cfg.d_ff, cfg.C, cfg.V, z.shape[1]),
                axes=("config",),
                desc=f"GPT B=2 T={z.shape[1]} {field} = {change[field]} f64 eval",
            )


def _errors(o: Oracle) -> None:
    gpt = _gpt(o, SMALL, "errors-w", torch.float32).eval()
    block = Block(SMALL).eval()
    ids = torch.zeros(1, 4, dtype=torch.int64)  # (1, 4)
    cases: dict[str, Any] = {
        "ids-negative": partial(gpt, torch.full((1, 4), -1)),
        "ids-int32": partial(gpt, ids.int()),
        "ids-meta": partial(gpt, ids.to("meta")),
        "ids-rank3": partial(gpt, ids[..., None]),
        "ids-empty": partial(gpt, ids[:, :0]),
        "block-rank2": partial(block, torch.zeros(4, 16)),
        "block-f16": partial(block, torch.zeros(1, 4, 16).half()),
        "trace-layer-negative": partial(gpt.forward_with_attn_trace, ids, -1),
    }
    sweeps.errors(o, cases)


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the backbone_v1 stage's oracle."""
    _magnitude(o)
    _grad2(o)
    _history(o)
    _modes_layout(o)
    _dtypes_configs(o)
    _errors(o)
