"""The fastpath stage's domain sweeps, second part (spec, issue 28; maintainer-owned).

``fastpath_oracle_domain.py`` (whose docstring says what each axis sweeps)
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
from torch.nn.attention import SDPBackend
from torch.nn.attention import sdpa_kernel as backends

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import (
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


def _kit() -> Any:
    """``fastpath_oracle_domain.py`` beside this file: the helpers these sweeps share."""
    path = Path(__file__).with_name("fastpath_oracle_domain.py")
    spec = importlib.util.spec_from_file_location("_fastpath_oracle_domain_kit", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_KIT = _kit()
ATTN = _KIT.ATTN
SMALL = _KIT.SMALL
STAGES = _KIT.STAGES
TRAINING_CALLS = _KIT.TRAINING_CALLS
_attn = _KIT._attn
_gpt = _KIT._gpt
_vs_explicit = _KIT._vs_explicit


def _backward(attn: Any, x: torch.Tensor) -> dict[str, Any]:
    attn.zero_grad()
    z = x.clone().requires_grad_(True)  # (B, T, C)
    y = attn(z)  # (B, T, C)
    y.square().sum().backward()
    return {"out": y.detach(), "dx": z.grad, **{n: p.grad for n, p in attn.named_parameters()}}


def _modes(o: Oracle) -> None:
    if not o.wants("domain/modes/eval"):
        return
    attn = _attn(o, ATTN, "modes-w")
    x = o.randn(2, 30, ATTN.C, tag="modes-x")  # (2, 30, C)
    o.call(
        "domain/modes/eval",
        partial(attn, x),
        axes=("modes",),
        **_vs_explicit(
            o, "domain/modes/eval", attn, partial(attn, x), desc="f64 eval", stages=4, reduction=30
        ),
    )
    for mode, ctx in (("no_grad", torch.no_grad), ("inference_mode", torch.inference_mode)):
        with ctx():
            o.call(
                f"domain/modes/{mode}",
                partial(attn, x),
                axes=("modes",),
                **_vs_explicit(
                    o,
                    f"domain/modes/{mode}",
                    attn,
                    partial(attn, x),
                    desc=f"f64 eval under {mode}",
                    stages=4,
                    reduction=30,
                ),
            )
    attn.train()  # dropout 0: training mode, nothing random
    o.call(
        "domain/modes/train",
        partial(_backward, attn, x),
        axes=("modes",),
        **_vs_explicit(
            o,
            "domain/modes/train",
            attn,
            partial(_backward, attn, x),
            desc="f64 train, backward",
            stages=8,
            reduction=60,
        ),
    )
    with torch.no_grad():

        def enabled() -> Any:
            with torch.enable_grad():
                return _backward(attn.eval(), x)

        o.call(
            "domain/modes/enable_grad",
            enabled,
            axes=("modes",),
            **_vs_explicit(
                o,
                "domain/modes/enable_grad",
                attn,
                enabled,
                desc="f64 eval, enable_grad inside no_grad, backward",
                stages=8,
                reduction=60,
            ),
        )
    drop = _attn(o, dataclasses.replace(ATTN, dropout=0.3), "modes-drop").train()
    later = x.clone()  # (2, 30, C)
    later[:, 12:] = 100.0 * o.randn(2, 18, ATTN.C, tag="modes-far")
    same = o.equal(
        ("domain/modes/dropout", "out", ((1, 0, 12),)),
        ("domain/modes/dropout-later", "out", ((1, 0, 12),)),
    )
    for what, z, rel in (("dropout", x, ()), ("dropout-later", later, (same,))):
        o.call(
            f"domain/modes/{what}",
            partial(drop, z),
            desc=f"f64 train, dropout 0.3{', inputs 12.. x100' if rel else ''}",
            stages=4,
            reduction=30,
            compare=(),
            relations=rel,
            axes=("modes",),
        )


def _hvp(o: Oracle, attn: Any, x: torch.Tensor, tag: str) -> dict[str, Any]:
    """``y``, the input gradient and H v for the input and every parameter (math backend)."""
    with backends([SDPBackend.MATH]):  # a non-leaf input (FLOP counting's module hooks)
        return dict(sweeps.output_hvp(o, attn, x, tag, out="out", feed=lambda z: z * 1.0))


def _grad2(o: Oracle) -> None:
    if not o.wants("domain/grad2/attn"):
        return
    attn = _attn(o, ATTN, "grad2-w").train()
    x = 2.0 * o.randn(2, 17, ATTN.C, tag="grad2-x")  # (2, 17, C)
    o.call(
        "domain/grad2/attn",
        partial(_hvp, o, attn, x, "grad2"),
        axes=("grad2",),
        **_vs_explicit(
            o,
            "domain/grad2/attn",
            attn,
            partial(_hvp, o, attn, x, "grad2"),
            desc="fast attention B=2 T=17 f64 train: H v (x, parameters), SDPA math backend",
            stages=4 * 4,
            reduction=40,
        ),
    )


def _history(o: Oracle) -> None:
    if not o.wants("domain/history/long/eval"):
        return
    cfg = ModelConfig(V=2, T=8, C=8, H=2, dropout=0.0)
    attn = _attn(o, cfg, "hist-w").train()
    x = o.randn(2, 8, 8, tag="hist-x")  # (2, 8, 8)

    def warm_up() -> None:
        for _ in range(TRAINING_CALLS):  # one fast module's long training run
            attn(x).square().mean().backward()

    sweeps.one_thread(warm_up)
    attn.eval()
    with torch.no_grad():
        o.call(
            "domain/history/long/eval",
            partial(attn, x),
            axes=("history",),
            **_vs_explicit(
                o,
                "domain/history/long/eval",
                attn,
                partial(attn, x),
                desc=f"fast attention f64 eval after {TRAINING_CALLS} training calls",
                stages=4,
                reduction=8,
            ),
        )
    attn.train()
    later = x.clone()  # (2, 8, 8)
    later[:, 3:] += 1.0
    same = o.equal(
        ("domain/history/long/train", "out", ((1, 0, 3),)),
        ("domain/history/long/later", "out", ((1, 0, 3),)),
    )
    for what, z, rel in (("train", x, ()), ("later", later, (same,))):
        o.call(
            f"domain/history/long/{what}",
            partial(attn, z),
            desc=f"f64 train after the long run{', inputs 3.. changed' if rel else ''}",
            stages=4,
            reduction=8,
            relations=rel,
            axes=("history",),
        )
    gpt = _gpt(o, SMALL, "hist-gpt")
    saved = io.BytesIO()
    torch.save(gpt.state_dict(), saved)
    saved.seek(0)
    fresh = use_fast_attention(GPT(SMALL).double().eval())
    fresh.load_state_dict(torch.load(saved, weights_only=True))
    ids = o.randint(SMALL.V, 2, 20, tag="hist-ids")  # (2, 20)
    with torch.no_grad():
        o.call(
            "domain/history/reloaded",
            partial(fresh, ids),
            stages=STAGES,
            reduction=24,
            desc="fast GPT loaded from a saved state_dict, f64 eval",
            axes=("history",),
            relations=[
                o.equal(("domain/history/reloaded", "out", ()), ("domain/history/saved", "out", ()))
            ],
        )
        o.call(
            "domain/history/saved",
            partial(gpt, ids),
            stages=STAGES,
            reduction=24,
            desc="the fast GPT that was saved, f64 eval",
            axes=("history",),
        )
    other = _attn(o, dataclasses.replace(cfg, C=12, H=3, T=16), "hist-w2")
    x2 = o.randn(1, 16, 12, tag="hist-x2")  # (1, 16, 12)
    for i in range(3):  # two modules in turn
        for who, m, z in (("a", attn, x), ("b", other, x2)):
            o.call(
                f"domain/history/interleaved/{i}{who}",
                partial(m, z),
                stages=4,
                reduction=16,
                axes=("history",),
                desc=f"two fast modules called in turn, round {i}, module {who}",
            )


class _Own(CausalSelfAttention):
    """A subclass of the attention the fast path does not know."""


def _errors(o: Oracle) -> None:
    attn = _attn(o, ATTN, "errors-w", torch.float32)
    x = torch.zeros(1, 4, ATTN.C)  # (1, 4, C)
    q = torch.zeros(1, 2, 5, 8)  # (1, 2, 5, 8)
    bad: dict[str, Any] = {
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
    sweeps.errors(o, bad)


def calls(o: Oracle) -> None:
    """The modes, grad2, history and errors sweeps (``domain/...``)."""
    _modes(o)
    _grad2(o)
    _history(o)
    _errors(o)
