"""The padding stage's domain sweeps, second part (spec, issue 28; maintainer-owned).

``padding_oracle_domain.py`` (whose docstring says what each axis sweeps)
calls ``calls(o)`` last: the modes, grad2, history and errors axes, split
off to keep each file to one screenful of ideas. The shared helpers and
constants are that file's, loaded by path (a driver's folder is no package).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

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

_SWEEPS = importlib.util.spec_from_file_location(  # the maintainers' oracle sweeps, by path
    "niels_speckit_sweeps", Path(__file__).parents[1] / "_kit" / "speckit_sweeps.py"
)
assert _SWEEPS is not None and _SWEEPS.loader is not None
sweeps = importlib.util.module_from_spec(_SWEEPS)
_SWEEPS.loader.exec_module(sweeps)


def _kit() -> Any:
    """``padding_oracle_domain.py`` beside this file: the helpers these sweeps share."""
    path = Path(__file__).with_name("padding_oracle_domain.py")
    spec = importlib.util.spec_from_file_location("_padding_oracle_domain_kit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_KIT = _kit()
FWD = _KIT.FWD
GEN = _KIT.GEN
GENERATE_CALLS = _KIT.GENERATE_CALLS
PADS = _KIT.PADS
SMALL = _KIT.SMALL
STAGES = _KIT.STAGES
TRAINING_CALLS = _KIT.TRAINING_CALLS
_forward = _KIT._forward
_gpt = _KIT._gpt
_mask = _KIT._mask


def _train_loss(gpt: GPT, ids: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> Any:
    gpt.zero_grad()
    logits = padded_forward(gpt, ids, mask)  # (B, t, V)
    assert isinstance(logits, torch.Tensor)
    loss = padded_cross_entropy(logits, targets, mask)
    torch.autograd.backward(loss)
    return {"loss": loss.detach(), **{n: p.grad for n, p in gpt.named_parameters()}}


def _modes(o: Oracle) -> None:
    if not o.wants("domain/modes/eval"):
        return
    gpt = _gpt(o, SMALL, "modes-w")
    ids = o.randint(SMALL.V, 3, 20, tag="modes-ids")  # (3, 20)
    targets = o.randint(SMALL.V, 3, 20, tag="modes-targets")  # (3, 20)
    _forward(o, "domain/modes/eval", gpt, ids, PADS, axes=("modes",), desc="f64 eval", reduction=24)
    for mode, ctx in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
        with ctx():
            _forward(
                o,
                f"domain/modes/{mode}",
                gpt,
                ids,
                PADS,
                axes=("modes",),
                desc=f"f64 eval under {mode}",
                reduction=24,
            )
    gpt.train()  # dropout 0: training mode, nothing random
    _forward(
        o, "domain/modes/train", gpt, ids, PADS, axes=("modes",), desc="f64 train", reduction=24
    )
    drop = _gpt(o, dataclasses.replace(SMALL, dropout=0.3), "modes-drop").train()
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

        def enabled() -> Any:
            with torch.enable_grad():
                return _train_loss(gpt.eval(), ids, targets, _mask(PADS, 20))

        o.call(
            "domain/modes/enable_grad",
            enabled,
            desc="f64 eval, enable_grad inside no_grad: padded loss, backward",
            stages=2 * STAGES,
            reduction=40,
            axes=("modes",),
        )


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


def _grad2(o: Oracle) -> None:
    if not o.wants("domain/grad2/padded-loss"):
        return
    gpt = _gpt(o, SMALL, "grad2-w").train()
    ids = o.randint(SMALL.V, 3, 14, tag="grad2-ids")  # (3, 14)
    o.call(
        "domain/grad2/padded-loss",
        partial(_hvp, o, gpt, ids, _mask((0, 5, 13), 14)),
        desc="GPT B=3 T=14 pads (0, 5, 13) f64 train, padded loss: H v (logits, parameters)",
        stages=4 * STAGES,
        reduction=48,
        axes=("grad2",),
    )


def _history(o: Oracle) -> None:
    if not o.wants("domain/history/long"):
        return
    cfg = ModelConfig(V=7, T=12, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    gpt = _gpt(o, cfg, "hist-w").train()
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
    with torch.no_grad():
        _forward(
            o,
            "domain/history/long",
            gpt,
            ids,
            pads,
            axes=("history",),
            desc=f"f64 eval {about}",
            reduction=12,
        )
    o.call(
        "domain/history/long/generate",
        partial(
            generate,
            gpt,
            ids[:, :5],
            _mask((0, 2, 4), 5),
            7,
            temperature=1.0,
            generator=[o.generator(f"hist{b}") for b in range(3)],
        ),
        desc=f"padded generate t=5 new=7 sampled a row each, {about}",
        stages=9,
        reduction=12,
        rules=GEN,
        axes=("history",),
    )
    saved = io.BytesIO()
    torch.save(gpt.state_dict(), saved)
    saved.seek(0)
    fresh = GPT(cfg).double().eval()
    fresh.load_state_dict(torch.load(saved, weights_only=True))
    with torch.no_grad():
        _forward(
            o,
            "domain/history/reloaded",
            fresh,
            ids,
            pads,
            axes=("history",),
            desc="a fresh model loaded from a saved state_dict",
            reduction=12,
        )
    other = _gpt(o, dataclasses.replace(cfg, V=11, C=12, H=3, T=16), "hist-w2")
    ids2 = o.randint(11, 2, 9, tag="hist-ids2")  # (2, 9)
    for i in range(3):  # two models in turn
        for who, m, z, p in (("a", gpt, ids, pads), ("b", other, ids2, (3, 0))):
            o.call(
                f"domain/history/interleaved/{i}{who}",
                partial(padded_forward, m, z, _mask(p, z.shape[1])),
                desc=f"two models in turn, round {i}, model {who}, f64 eval, pads {p}",
                stages=9,
                reduction=16,
                rules=FWD,
                axes=("history",),
            )


def _errors(o: Oracle) -> None:
    gpt = _gpt(o, ModelConfig(V=10, T=8, C=16, H=2, L=2, d_ff=16), "errors-w", torch.float32)
    ids = torch.zeros(2, 4, dtype=torch.int64)  # (2, 4)
    mask = _mask((0, 1), 4)  # (2, 4)
    logits = torch.zeros(2, 4, 10)  # (2, 4, 10)
    sin, cos = rope.rope_cache(16, 8)
    q = torch.zeros(2, 2, 3, 8)  # (2, 2, 3, 8)
    pos = torch.zeros(2, 3, dtype=torch.int64)  # (2, 3)
    bad: dict[str, Any] = {
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
    sweeps.errors(o, bad, "bad argument")


def calls(o: Oracle) -> None:
    """The modes, grad2, history and errors sweeps (``domain/...``)."""
    _modes(o)
    _grad2(o)
    _history(o)
    _errors(o)
