"""The padding stage's domain sweeps (loaded by ``padding_oracle.calls``; ``domain/...``).

Each call names the spec's ``[oracle].axes`` it sweeps (``contracts check``
refuses the spec when one is never named). The earlier calls already sweep
``combos`` (fast path x KV cache x key mask x positions x padding through
padded ``generate``, ``combos/...``) and part of ``errors`` (``bad/...``),
tagged there. All compared with the base's answers, in float64 unless the
axis is the dtype; padded forwards also keep the stage's invariants (each
row's real logits those of the row alone, padded positions exactly 0). The
model sweep's table (``speckit.model_sweeps``) calls
``padded_forward`` so, and follows it with a padded generate call: weights
scaled up to x1000 (greedy), a float32 and a float16 model and a float32 one
under bfloat16 autocast, every ``ModelConfig`` field away from its default
(sampled), train (dropout off), eval, ``no_grad`` and ``inference_mode``,
every bad argument the spec documents raising as the base. What is the
stage's own:

- magnitude: ``padded_cross_entropy`` and its gradient on logits scaled up
  to 1e30 in float32 and 1e300 in float64, where each dtype is still finite;
- dtype: a bfloat16 model generating;
- layout: non-contiguous ids, masks, prompts, logits and targets;
- modes: train with dropout on (only the padded zeros compared),
  ``enable_grad`` (inside ``no_grad``, a padded loss's backward); padded
  generate on a model in training mode;
- grad2: Hessian-vector products of the padded loss, with respect to every
  parameter through ``padded_forward`` and with respect to the logits;
- history: one model after 250 padded training calls (forward, padded loss,
  backward) and 60 padded generate calls; two models in turn; a model
  rebuilt from a saved ``state_dict``.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
from speckit import model_sweeps as sweeps

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import (
    apply_rope_rows,
    generate,
    padded_cross_entropy,
    padded_forward,
)

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle


LOGIT_SCALES = {torch.float32: (1.0, 10.0, 30.0, 1e3, 1e30), torch.float64: (1.0, 30.0, 1e300)}
TRAINING_CALLS = 250
GENERATE_CALLS = 60
SMALL = ModelConfig(V=13, T=24, C=16, L=2, H=2, d_ff=24, dropout=0.0)
STAGES = sweeps.depth(SMALL)
OWN = sweeps.Scenarios()  # the stage's own scenarios by axis, run after the table's
PADS = (0, 7, 19)  # none, some, all but one of 20 columns
FWD = ("no-sdpa-runtime",)
GEN = ("no-sdpa-in-generate", "no-cat-in-generate")


def _mask(pads: tuple[int, ...], t: int) -> torch.Tensor:
    cols = torch.arange(t)  # (t,)
    return cols[None, :] >= torch.tensor(pads)[:, None]  # (B, t) bool, left-padded


def _forward(
    o: Oracle, name: str, gpt: GPT, ids: torch.Tensor, pads: tuple[int, ...] = PADS
) -> list[Any]:
    """The table's forward: a padded forward (``name``), equal row by row to each row alone
    (the most padded one, ``name/alone``) and exactly 0 at pads (invariants)."""
    t = ids.shape[1]
    relations = [o.zero((name, "out", ((0, b, b + 1), (1, 0, p)))) for b, p in enumerate(pads)]
    b, p = len(pads) - 1, pads[-1]  # the most padded row, alone
    relations.append(
        o.equal((name, "out", ((0, b, b + 1), (1, p, t))), (f"{name}/alone", "out", ()))
    )
    alone = partial(padded_forward, gpt, ids[b : b + 1, p:], None)
    return [
        sweeps.Call("/alone", alone, f"{{}}: row {b} alone"),
        sweeps.Call(
            "",
            partial(padded_forward, gpt, ids, _mask(pads, t)),
            f"{{}}, pads {pads}",
            {"rules": FWD, "relations": relations},
        ),
    ]


def _config_forward(o: Oracle, name: str, gpt: GPT, ids: torch.Tensor) -> list[Any]:
    """The config sweep's forward: pads 0, 5 and all but one of the drawn length."""
    return _forward(o, name, gpt, ids, (0, 5, ids.shape[1] - 1))


def _generate(o: Oracle, name: str, gpt: GPT, ids: torch.Tensor, key: str) -> Any:
    """After each magnitude forward a greedy padded generate, after each config one a
    sampled one (a generator a row)."""
    if name.startswith("domain/magnitude/"):
        fn = partial(generate, gpt, ids[:, :8], _mask((0, 3, 7), 8), 10, temperature=0.0)
        what = "greedy padded generate t=8 pads (0, 3, 7) new=10"
    else:
        rows = [o.generator(f"{key}{b}") for b in range(3)]
        fn = partial(generate, gpt, ids[:, :6], _mask((0, 2, 5), 6), 6, temperature=1.0,
                     generator=rows)  # fmt: skip
        what = "padded generate t=6 pads (0, 2, 5) new=6 sampled a row each"
    return sweeps.Call("/generate", fn, f"{what}, {{}}", {"rules": GEN})


def _loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    z = logits.detach().requires_grad_(True)  # (B, t, V)
    loss = padded_cross_entropy(z, targets, mask)
    torch.autograd.backward(loss)
    return {"loss": loss.detach(), "grad": z.grad}


@OWN.axis("magnitude", "domain/magnitude/loss/float64/s=1")
def _loss_magnitude(o: Oracle) -> None:
    logits = 3.0 * o.randn(3, 9, 40, tag="mag-logits")  # (3, 9, 40)
    targets = o.randint(40, 3, 9, tag="mag-targets")  # (3, 9)
    mask = _mask((0, 4, 8), 9)  # (3, 9)
    for dtype, scales in LOGIT_SCALES.items():
        short = str(dtype).removeprefix("torch.")
        for s in scales:
            o.call(
                f"domain/magnitude/loss/{short}/s={s:g}",
                partial(_loss, (s * logits).to(dtype), targets, mask),
                desc=f"padded_cross_entropy (3, 9, 40) {short} logits x{s:g}, backward",
                stages=4,
                reduction=40,
                axes=("magnitude",),
            )


@OWN.axis("dtype", "domain/dtype/bf16/generate")
def _generate_bf16(o: Oracle) -> None:
    ids = o.randint(SMALL.V, 3, 20, tag="dtype-ids")  # (3, 20)
    gpt = sweeps.model(o, TABLE, SMALL, "dtype-w", torch.bfloat16)
    prompt, mask = ids[:, :8], _mask((0, 3, 7), 8)  # (3, 8) each
    o.call(
        "domain/dtype/bf16/generate",
        partial(generate, gpt, prompt, mask, 9, temperature=1e-4, generator=o.generator("bf16")),
        desc="bf16 model, padded generate t=8 new=9 at temperature 1e-4",
        stages=STAGES,
        reduction=24,
        rules=GEN,
        computes_in=torch.bfloat16,
        axes=("dtype",),
    )


@OWN.axis("layout", "domain/layout/ids-mask-transposed")
def _layout(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, SMALL, "layout-w")
    ids = o.randint(SMALL.V, 20, 3, tag="layout-ids").t()  # (3, 20), non-contiguous
    mask = _mask(PADS, 20).t().contiguous().t()  # (3, 20), non-contiguous
    prompt = o.randint(SMALL.V, 3, 16, tag="layout-prompt")[:, ::2]  # (3, 8), strided
    with torch.no_grad():
        o.call(
            "domain/layout/ids-mask-transposed",
            partial(padded_forward, gpt, ids, mask, trace_layer=1),
            desc="padded_forward on transposed (3, 20) ids and mask, f64 eval, trace",
            stages=STAGES,
            reduction=24,
            rules=FWD,
            axes=("layout",),
        )
    rows = [o.generator(f"layout{b}") for b in range(3)]
    o.call(
        "domain/layout/prompt-strided",
        partial(
            generate,
            gpt,
            prompt,
            _mask((0, 2, 5), 8).t().contiguous().t(),
            8,
            temperature=0.9,
            generator=rows,
        ),
        desc="padded generate from a strided (3, 8) prompt and a transposed mask, sampled",
        stages=STAGES,
        reduction=24,
        rules=GEN,
        axes=("layout",),
    )
    logits = o.randn(40, 9, 3, tag="layout-logits").permute(2, 1, 0)  # (3, 9, 40)
    targets = o.randint(40, 9, 3, tag="layout-targets").t()  # (3, 9)
    o.call(
        "domain/layout/loss-permuted",
        partial(_loss, logits, targets, _mask((0, 4, 8), 9)),
        desc="padded_cross_entropy on permuted (3, 9, 40) logits and transposed targets",
        stages=4,
        reduction=40,
        axes=("layout",),
    )
    sin, cos = rope.rope_cache(64, 8, dtype=torch.float64)
    q = o.randn(3, 2, 8, 11, tag="layout-q").transpose(2, 3)  # (3, 2, 11, 8)
    k = o.randn(3, 11, 2, 8, tag="layout-k").transpose(1, 2)  # (3, 2, 11, 8)
    o.call(
        "domain/layout/rope-rows",
        partial(apply_rope_rows, q, k, sin, cos, o.randint(64, 11, 3, tag="layout-pos").t()),
        desc="apply_rope_rows on transposed q, k and positions, f64",
        stages=2,
        reduction=2,
        axes=("layout",),
    )


def _train_loss(gpt: GPT, ids: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> Any:
    gpt.zero_grad()
    logits = padded_forward(gpt, ids, mask)  # (B, t, V)
    assert isinstance(logits, torch.Tensor)
    loss = padded_cross_entropy(logits, targets, mask)
    torch.autograd.backward(loss)
    return {"loss": loss.detach(), **{n: p.grad for n, p in gpt.named_parameters()}}


@OWN.axis("modes", "domain/modes/train-dropout", "domain/modes/train-generate",
          "domain/modes/enable_grad")  # fmt: skip
def _modes(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, SMALL, "modes-w").train()  # dropout 0: nothing random
    ids = o.randint(SMALL.V, 3, 20, tag="modes-ids")  # (3, 20)
    targets = o.randint(SMALL.V, 3, 20, tag="modes-targets")  # (3, 20)
    drop = sweeps.model(o, TABLE, dataclasses.replace(SMALL, dropout=0.3), "modes-drop").train()
    with torch.no_grad():
        o.call(
            "domain/modes/train-dropout",
            partial(padded_forward, drop, ids, _mask(PADS, 20)),
            desc="f64 train, dropout 0.3: only the padded zeros are judged",
            stages=STAGES,
            reduction=24,
            rules=FWD,
            compare=(),
            axes=("modes",),
            relations=[
                o.zero(("domain/modes/train-dropout", "out", ((0, b, b + 1), (1, 0, p))))
                for b, p in enumerate(PADS)
            ],
        )
        o.call(
            "domain/modes/train-generate",
            partial(generate, gpt, ids[:, :8], _mask((0, 3, 7), 8), 8, temperature=0.0),
            desc="greedy padded generate t=8 new=8 on a model in training mode",
            stages=STAGES,
            reduction=24,
            rules=GEN,
            axes=("modes",),
        )
        sweeps.enable_grad(o, lambda: _train_loss(gpt.eval(), ids, targets, _mask(PADS, 20)),
                           "f64 eval, enable_grad inside no_grad: padded loss, backward",
                           stages=2 * STAGES, reduction=40)  # fmt: skip


def _hvp(o: Oracle, gpt: GPT, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    """The padded loss, its parameter and logit gradients, and H v for both."""
    names, params = zip(*gpt.named_parameters(), strict=True)
    logits = padded_forward(gpt, ids, mask)  # (B, t, V)
    assert isinstance(logits, torch.Tensor)
    targets = o.randint(gpt.cfg.V, *ids.shape, tag="grad2-targets")  # (B, t)
    wrt = [logits, *params]
    loss = padded_cross_entropy(logits, targets, mask)
    first = torch.autograd.grad(loss, wrt, create_graph=True)
    second = sweeps.hessian_vector(o, first, wrt, "grad2")
    out: dict[str, Any] = {"loss": loss.detach(), "hvp.logits": second[0]}
    out.update({f"grad.{n}": g.detach() for n, g in zip(names, first[1:], strict=True)})
    out.update({f"hvp.{n}": h for n, h in zip(names, second[1:], strict=True)})
    return out


@OWN.axis("grad2", "domain/grad2/padded-loss")
def _grad2(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, SMALL, "grad2-w").train()
    ids = o.randint(SMALL.V, 3, 14, tag="grad2-ids")  # (3, 14)
    o.call(
        "domain/grad2/padded-loss",
        partial(_hvp, o, gpt, ids, _mask((0, 5, 13), 14)),
        desc="GPT B=3 T=14 pads (0, 5, 13) f64 train, padded loss: H v (logits, parameters)",
        stages=4 * STAGES,
        reduction=48,
        axes=("grad2",),
    )


@OWN.axis("history", "domain/history/long")
def _history(o: Oracle) -> None:
    cfg = ModelConfig(V=7, T=12, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    gpt = sweeps.model(o, TABLE, cfg, "hist-w").train()
    ids = o.randint(cfg.V, 3, 10, tag="hist-ids")  # (3, 10)
    targets = o.randint(cfg.V, 3, 10, tag="hist-targets")  # (3, 10)
    pads = (0, 4, 9)
    mask = _mask(pads, 10)  # (3, 10)

    def warm_up() -> None:
        for _ in range(TRAINING_CALLS):  # one model's long padded training run
            logits = padded_forward(gpt, ids, mask)  # (3, 10, V)
            assert isinstance(logits, torch.Tensor)
            torch.autograd.backward(padded_cross_entropy(logits, targets, mask))
        g = o.generator("hist-many")
        for i in range(GENERATE_CALLS):  # and many padded generate calls
            generate(gpt, ids[:, :5], _mask((0, 2, 4), 5), 1 + i % 2, temperature=1.0, generator=g)

    sweeps.one_thread(warm_up)
    gpt.eval()
    about = f"after {TRAINING_CALLS} padded training calls and {GENERATE_CALLS} generate calls"
    judged: dict[str, Any] = {"stages": 9, "reduction": 12, "axes": ("history",)}
    with torch.no_grad():
        name = "domain/history/long"
        sweeps.judge(o, name, _forward(o, name, gpt, ids, pads), f"f64 eval {about}", **judged)
    rows = [o.generator(f"hist{b}") for b in range(3)]
    o.call(
        "domain/history/long/generate",
        partial(generate, gpt, ids[:, :5], _mask((0, 2, 4), 5), 7, temperature=1.0, generator=rows),
        desc=f"padded generate t=5 new=7 sampled a row each, {about}",
        stages=9,
        reduction=12,
        rules=GEN,
        axes=("history",),
    )
    fresh, name = sweeps.reloaded(TABLE, gpt, cfg), "domain/history/reloaded"
    with torch.no_grad():
        sweeps.judge(o, name, _forward(o, name, fresh, ids, pads),
                     "a fresh model loaded from a saved state_dict", **judged)  # fmt: skip
    other = sweeps.model(o, TABLE, dataclasses.replace(cfg, V=11, C=12, H=3, T=16), "hist-w2")
    sweeps.in_turn(
        o,
        (gpt, (ids, pads)),
        (other, (o.randint(11, 2, 9, tag="hist-ids2"), (3, 0))),  # (2, 9)
        lambda m, z, _: partial(padded_forward, m, z[0], _mask(z[1], z[0].shape[1])),
        desc="two models in turn, round {round}, model {who}, f64 eval, padded",
        stages=9,
        reduction=16,
        rules=FWD,
    )


def _errors(o: Oracle) -> dict[str, Any]:
    cfg = ModelConfig(V=10, T=8, C=16, H=2, L=2, d_ff=16)
    gpt = sweeps.model(o, TABLE, cfg, "errors-w", torch.float32)
    ids = torch.zeros(2, 4, dtype=torch.int64)  # (2, 4)
    mask = _mask((0, 1), 4)  # (2, 4)
    logits = torch.zeros(2, 4, 10)  # (2, 4, 10)
    sin, cos = rope.rope_cache(16, 8)
    q = torch.zeros(2, 2, 3, 8)  # (2, 2, 3, 8)
    pos = torch.zeros(2, 3, dtype=torch.int64)  # (2, 3)
    return {
        "forward-not-gpt": partial(padded_forward, cast(Any, gpt.blocks[0]), ids, mask),
        "forward-ids-int32": partial(padded_forward, gpt, ids.int(), mask),
        "forward-ids-range": partial(padded_forward, gpt, ids + 10, mask),
        "forward-ids-rank1": partial(padded_forward, gpt, ids[0], mask[0]),
        "forward-too-long": partial(
            padded_forward, gpt, torch.zeros(2, 9, dtype=torch.int64), None
        ),
        "forward-mask-meta": partial(padded_forward, gpt, ids, mask.to("meta")),
        "forward-mask-float": partial(padded_forward, gpt, ids, mask.double()),
        "generate-mask-empty-row": partial(generate, gpt, ids, _mask((0, 4), 4), 1),
        "forward-mask-holes": partial(
            padded_forward, gpt, ids, torch.tensor([[True, False, True, True]] * 2)
        ),
        "forward-trace-bool": partial(padded_forward, gpt, ids, mask, trace_layer=True),
        "forward-trace-past": partial(padded_forward, gpt, ids, mask, trace_layer=2),
        "generate-too-long": partial(generate, gpt, ids, mask, 5),
        "generate-mask-shape": partial(generate, gpt, ids, mask[:, :3], 1),
        "generate-generators-short": partial(
            generate, gpt, ids, mask, 1, generator=[torch.Generator()]
        ),
        "generate-generators-holding-int": partial(
            generate, gpt, ids, mask, 1, generator=cast(Any, [torch.Generator(), 3])
        ),
        "generate-top_k-zero": partial(generate, gpt, ids, mask, 1, top_k=0),
        "generate-eos-range": partial(generate, gpt, ids, mask, 1, eos_id=10),
        "generate-new-bool": partial(generate, gpt, ids, mask, True),
        "loss-rank2": partial(padded_cross_entropy, logits[0], ids[0], mask[0]),
        "loss-int-logits": partial(padded_cross_entropy, logits.long(), ids, mask),
        "loss-targets-int32": partial(padded_cross_entropy, logits, ids.int(), mask),
        "loss-targets-shape": partial(padded_cross_entropy, logits, ids[:, :3], mask),
        "loss-target-range": partial(padded_cross_entropy, logits, ids + 10, mask),
        "loss-mask-shape": partial(padded_cross_entropy, logits, ids, mask[:1]),
        "rows-rank3": partial(apply_rope_rows, q[0], q[0], sin, cos, pos),
        "rows-k-shape": partial(apply_rope_rows, q, q[:, :, :2], sin, cos, pos),
        "rows-int": partial(apply_rope_rows, q.long(), q.long(), sin, cos, pos),
        "rows-odd-D": partial(apply_rope_rows, q[..., :7], q[..., :7], sin, cos, pos),
        "rows-table-dtype": partial(apply_rope_rows, q, q, sin.double(), cos.double(), pos),
        "rows-positions-int32": partial(apply_rope_rows, q, q, sin, cos, pos.int()),
        "rows-positions-negative": partial(apply_rope_rows, q, q, sin, cos, pos - 1),
        "rows-empty": partial(apply_rope_rows, q[:, :, :0], q[:, :, :0], sin, cos, pos[:, :0]),
    }


TABLE = sweeps.ModelSweep(
    build=GPT,
    small=SMALL,
    forward=_forward,
    suffixes=("", "/alone"),
    config_forward=_config_forward,
    batch=3,
    dtypes={
        "f32": (torch.float32, None),
        "f16": (torch.float16, None),
        "autocast-bf16": (torch.float32, torch.bfloat16),
    },
    modes=("eval", "no_grad", "inference_mode", "train"),
    after=_generate,
    errors=_errors,
    scenarios=OWN,
)


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the padding stage's oracle."""
    sweeps.model_sweeps(o, TABLE)
