"""backbone_v1's domain sweeps (loaded by ``backbone_v1_oracle.calls``; ``domain/...``).

Each call names the spec's ``[oracle].axes`` it sweeps (``contracts check``
refuses the spec when one is never named). All compared with the base's
answers, in float64 unless the axis is the dtype. The model sweep's table
(``speckit.model_sweeps``) calls ``GPT`` plainly: weights
scaled up to x1000, float32 and float16 models, every ``ModelConfig`` field
away from the default, bad inputs raising as the base. What is the
backbone's own:

- magnitude: a ``Block``'s inputs and weights scaled by the same factors;
  the bound's sum length covers the largest attention score (exp turns a
  score's rounding, ``|s| u``, into a relative error of the probabilities);
- dtype: float16 autocast of the attention trace;
- layout: non-contiguous ids and block inputs;
- modes: the trace in train and eval, ``no_grad``, ``inference_mode``;
  ``enable_grad`` under ``no_grad`` with a backward;
- grad2: Hessian-vector products (``autograd.grad`` with ``create_graph``,
  then the gradient of ``<g', v>``) of ``Block``, ``MLP`` and ``RMSNorm``
  with respect to the input and every parameter, and of ``GPT``'s
  cross-entropy loss with respect to every parameter;
- history: one model after 2100 training calls (forward and backward),
  judged in eval and, in training, by causality; two models called in turn;
  a model rebuilt from a saved ``state_dict``.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from speckit import model_sweeps as sweeps
from speckit.module_sweeps import scaled
from speckit.sweeps import TRAINING_CALLS

from niels_gpt.config import ModelConfig
from niels_gpt.model.blocks import MLP, Block, RMSNorm
from niels_gpt.model.gpt import GPT

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

SMALL = ModelConfig(V=11, T=24, C=16, L=2, H=2, d_ff=24, dropout=0.0)
STAGES = sweeps.depth(SMALL)
OWN = sweeps.Scenarios()  # the stage's own scenarios by axis, run after the table's


@OWN.axis("magnitude", "domain/magnitude/block/s=1")
def _block_magnitude(o: Oracle) -> None:
    x0 = o.randn(2, 20, SMALL.C, tag="mag-x")  # (2, 20, C)
    for s, block, x in scaled(o, partial(Block, SMALL), x0, "mag-block"):
        with torch.no_grad():
            o.call(
                f"domain/magnitude/block/s={s:g}",
                partial(block, x, return_attn=True),
                desc=f"Block B=2 T=20 C=16 f64 eval, inputs and weights x{s:g}",
                stages=7,
                reduction=max(SMALL.d_ff, 20, sweeps.score_bound(block.attn, block.ln1(x))),
                axes=("magnitude",),
            )


@OWN.axis("dtype", "domain/dtype/autocast-f16")
def _autocast(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, SMALL, "dtype-w", torch.float32)
    ids = o.randint(SMALL.V, 2, 20, tag="dtype-ids")  # (2, 20)

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


@OWN.axis("layout", "domain/layout/ids-transposed")
def _layout(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, SMALL, "modes-w")
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
            o.call(
                f"domain/layout/{what}",
                partial(gpt, z) if what.startswith("ids") else partial(block, z),
                desc=f"{what} (non-contiguous) input, f64 eval",
                stages=STAGES,
                reduction=20,
                axes=("layout",),
            )


def _enable_grad(gpt: GPT, ids: torch.Tensor) -> dict[str, Any]:
    with torch.no_grad(), torch.enable_grad():
        gpt.zero_grad()
        y = gpt(ids)  # (B, T, V)
        y.square().sum().backward()
    return {"y": y.detach(), **{n: p.grad for n, p in gpt.named_parameters()}}


@OWN.axis("modes", "domain/modes/train")
def _modes(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, SMALL, "modes-w")
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


@OWN.axis("grad2")
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
        gpt = sweeps.model(o, TABLE, SMALL, "grad2-gpt").train()
        ids = o.randint(SMALL.V, 2, 13, tag="grad2-ids")  # (2, 13)
        o.call(
            "domain/grad2/gpt-loss",
            partial(sweeps.cross_entropy_hvp, o, gpt, partial(gpt, ids), "grad2-gpt"),
            desc="GPT B=2 T=13 C=16 L=2 f64 cross-entropy: Hessian-vector products (parameters)",
            stages=4 * STAGES,
            reduction=max(SMALL.d_ff, SMALL.V, 26),
            axes=("grad2",),
        )


@OWN.axis("history", "domain/history/long/eval")
def _history(o: Oracle) -> None:
    name = "domain/history/long"
    cfg = ModelConfig(V=5, T=8, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    gpt = sweeps.model(o, TABLE, cfg, "hist-w").train()
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
    about = "GPT B=2 T=8 f64 train after the long run"
    sweeps.causal_pair(
        o,
        (f"{name}/train", f"{name}/later"),
        (partial(gpt, ids), partial(gpt, later)),
        3,
        desc=(about, f"{about}, ids 3.. changed"),
        stages=9,
        reduction=8,
        axes=("history",),
    )
    with torch.no_grad():
        o.call(
            "domain/history/reloaded",
            partial(sweeps.reloaded(TABLE, gpt, cfg), ids),
            stages=9,
            reduction=8,
            desc="GPT B=2 T=8 f64 eval, a fresh model loaded from a saved state_dict",
            axes=("history",),
        )
    other = sweeps.model(o, TABLE, dataclasses.replace(cfg, V=7, C=12, H=3, T=16), "hist-w2")
    sweeps.in_turn(
        o,
        (gpt, ids),
        (other.train(), o.randint(7, 1, 16, tag="hist-ids2")),  # (1, 16)
        lambda m, z, _: partial(m, z),
        desc="two models called in turn, round {round}, model {who} f64 train",
        stages=9,
        reduction=16,
    )


def _errors(o: Oracle) -> dict[str, Any]:
    gpt = sweeps.model(o, TABLE, SMALL, "errors-w", torch.float32)
    block = Block(SMALL).eval()
    ids = torch.zeros(1, 4, dtype=torch.int64)  # (1, 4)
    return {
        "ids-negative": partial(gpt, torch.full((1, 4), -1)),
        "ids-int32": partial(gpt, ids.int()),
        "ids-meta": partial(gpt, ids.to("meta")),
        "ids-rank3": partial(gpt, ids[..., None]),
        "ids-empty": partial(gpt, ids[:, :0]),
        "block-rank2": partial(block, torch.zeros(4, 16)),
        "block-f16": partial(block, torch.zeros(1, 4, 16).half()),
        "trace-layer-negative": partial(gpt.forward_with_attn_trace, ids, -1),
    }


TABLE = sweeps.ModelSweep(
    build=GPT,
    small=SMALL,
    forward=sweeps.plain,
    reduction=20,
    part="gpt/",
    dtypes={"f32": (torch.float32, None), "f16": (torch.float16, None)},
    errors=_errors,
    scenarios=OWN,
)


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the backbone_v1 stage's oracle."""
    sweeps.model_sweeps(o, TABLE)
