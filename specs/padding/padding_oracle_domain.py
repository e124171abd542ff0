"""The padding stage's domain sweeps (spec 3.5, issue 28; maintainer-owned).

``calls(o)`` runs after the driver's earlier calls (``padding_oracle.py``
chains it), one call group per axis the spec declares in
``[oracle].axes``; each call names the axis it sweeps (``contracts check``
refuses the spec when one is never named). The earlier calls already sweep
``combos`` (fast path x KV cache x key mask x positions x padding through
padded ``generate``, ``combos/...``) and part of ``errors`` (``bad/...``),
tagged there. All compared with the base's answers, in float64 unless the
axis is the dtype; padded forwards also keep the stage's invariants (each
row's real logits those of the row alone, padded positions exactly 0):

- magnitude: weights scaled by 1, 10, 30, 100 and 1000 (padded forward and
  greedy padded generate); ``padded_cross_entropy`` and its gradient on
  logits scaled up to 1e30 in float32 and 1e300 in float64, where each dtype
  is still finite;
- dtype: a float32 and a float16 model, a float32 model under bfloat16
  autocast, a bfloat16 model generating;
- layout: non-contiguous ids, masks, prompts, logits and targets;
- config: every ``ModelConfig`` field away from its default, padded forward
  and padded generate;
- modes: train (dropout off, then on with only the padded zeros compared) and
  eval, ``no_grad``, ``inference_mode``, ``enable_grad`` (inside ``no_grad``,
  a padded loss's backward); padded generate on a model in training mode;
- grad2: Hessian-vector products of the padded loss, with respect to every
  parameter through ``padded_forward`` and with respect to the logits;
- history: one model after 250 padded training calls (forward, padded loss,
  backward) and 60 padded generate calls; two models in turn; a model
  rebuilt from a saved ``state_dict``;
- errors: every bad argument the spec documents raises as the base raises it.
"""

from __future__ import annotations

import importlib.util
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model.blocks import Block
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

SCALES = (1.0, 10.0, 30.0, 100.0, 1000.0)
LOGIT_SCALES = {torch.float32: (1.0, 10.0, 30.0, 1e3, 1e30), torch.float64: (1.0, 30.0, 1e300)}
TRAINING_CALLS = 250
GENERATE_CALLS = 60
SMALL = ModelConfig(V=13, T=24, C=16, L=2, H=2, d_ff=24, dropout=0.0)
STAGES = 7 * SMALL.L + 2
PADS = (0, 7, 19)  # none, some, all but one of 20 columns
FWD = ("no-sdpa-runtime",)
GEN = ("no-sdpa-in-generate", "no-cat-in-generate")


def _gpt(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype = torch.float64) -> GPT:
    gpt = GPT(cfg).to(dtype).eval()
    o.load_weights(gpt, tag)
    return gpt


def _mask(pads: tuple[int, ...], t: int) -> torch.Tensor:
    cols = torch.arange(t)  # (t,)
    return cols[None, :] >= torch.tensor(pads)[:, None]  # (B, t) bool, left-padded


def _bound(gpt: GPT, ids: torch.Tensor) -> int:
    """An upper bound of every attention score ``|q . k| / sqrt(D)`` of ``gpt`` on ``ids``."""
    top = 0
    with torch.no_grad():
        h = gpt.tok_emb(ids)  # (B, T, C): the first block's input
        for block in gpt.blocks:
            attn = cast(Block, block).attn
            q, k, _ = attn.qkv(cast(Block, block).ln1(h)).split(attn.cfg.C, dim=-1)  # (B, T, C)
            score = q.norm(dim=-1).max() * k.norm(dim=-1).max() / attn.head_dim**0.5
            top = max(top, int(score) + 1)
            h = block(h)  # (B, T, C)
    return top


def _forward(
    o: Oracle,
    name: str,
    gpt: GPT,
    ids: torch.Tensor,
    pads: tuple[int, ...],
    *,
    axes: tuple[str, ...],
    desc: str,
    reduction: int,
    computes_in: torch.dtype | None = None,
) -> None:
    """A padded forward, equal row by row to each row alone and exactly 0 at pads."""
    t = ids.shape[1]
    stages = 7 * gpt.cfg.L + 2
    relations = [o.zero((name, "out", ((0, b, b + 1), (1, 0, p)))) for b, p in enumerate(pads)]
    b, p = len(pads) - 1, pads[-1]  # the most padded row, alone
    o.call(
        f"{name}/alone",
        partial(padded_forward, gpt, ids[b : b + 1, p:], None),
        desc=f"{desc}: row {b} alone",
        stages=stages,
        reduction=reduction,
        computes_in=computes_in,
        axes=axes,
    )
    relations.append(
        o.equal((name, "out", ((0, b, b + 1), (1, p, t))), (f"{name}/alone", "out", ()))
    )
    o.call(
        name,
        partial(padded_forward, gpt, ids, _mask(pads, t)),
        desc=f"{desc}, pads {pads}",
        stages=stages,
        reduction=reduction,
        rules=FWD,
        computes_in=computes_in,
        axes=axes,
        relations=relations,
    )


def _loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> dict[str, Any]:
    z = logits.detach().requires_grad_(True)  # (B, t, V)
    loss = padded_cross_entropy(z, targets, mask)
    torch.autograd.backward(loss)
    return {"loss": loss.detach(), "grad": z.grad}


def _magnitude(o: Oracle) -> None:
    if not o.wants("domain/magnitude/s=1"):
        return
    ids = o.randint(SMALL.V, 3, 20, tag="mag-ids")  # (3, 20)
    for s in SCALES:
        gpt = GPT(SMALL).double().eval()
        o.load_weights(gpt, "mag-gpt", scale=s / SMALL.C**0.5)  # weights x s
        m = max(SMALL.d_ff, SMALL.V, 20, _bound(gpt, ids))
        about = f"GPT B=3 T=20 C=16 L=2 f64 eval, weights x{s:g}"
        with torch.no_grad():
            _forward(
                o,
                f"domain/magnitude/s={s:g}",
                gpt,
                ids,
                PADS,
                axes=("magnitude",),
                desc=about,
                reduction=m,
            )
        o.call(
            f"domain/magnitude/s={s:g}/generate",
            partial(generate, gpt, ids[:, :8], _mask((0, 3, 7), 8), 10, temperature=0.0),
            desc=f"greedy padded generate t=8 pads (0, 3, 7) new=10, {about}",
            stages=STAGES,
            reduction=m,
            rules=GEN,
            axes=("magnitude",),
        )
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


def _dtypes(o: Oracle) -> None:
    if not o.wants("domain/dtype/f32"):
        return
    ids = o.randint(SMALL.V, 3, 20, tag="dtype-ids")  # (3, 20)
    with torch.no_grad():
        for dtype, short in ((torch.float32, "f32"), (torch.float16, "f16")):
            gpt = _gpt(o, SMALL, "dtype-w", dtype)
            _forward(
                o,
                f"domain/dtype/{short}",
                gpt,
                ids,
                PADS,
                axes=("dtype",),
                desc=f"{short} model eval",
                reduction=24,
                computes_in=dtype,
            )
        gpt = _gpt(o, SMALL, "dtype-w", torch.float32)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _forward(
                o,
                "domain/dtype/autocast-bf16",
                gpt,
                ids,
                PADS,
                axes=("dtype",),
                desc="f32 model under bfloat16 autocast",
                reduction=24,
                computes_in=torch.bfloat16,
            )
    gpt = _gpt(o, SMALL, "dtype-w", torch.bfloat16)
    o.call(
        "domain/dtype/bf16/generate",
        partial(
            generate,
            gpt,
            ids[:, :8],
            _mask((0, 3, 7), 8),
            9,
            temperature=1e-4,
            generator=o.generator("bf16"),
        ),
        desc="bf16 model, padded generate t=8 new=9 at temperature 1e-4",
        stages=STAGES,
        reduction=24,
        rules=GEN,
        computes_in=torch.bfloat16,
        axes=("dtype",),
    )


def _layout(o: Oracle) -> None:
    if not o.wants("domain/layout/ids-mask-transposed"):
        return
    gpt = _gpt(o, SMALL, "layout-w")
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
    o.call(
        "domain/layout/prompt-strided",
        partial(
            generate,
            gpt,
            prompt,
            _mask((0, 2, 5), 8).t().contiguous().t(),
            8,
            temperature=0.9,
            generator=[o.generator(f"layout{b}") for b in range(3)],
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


def _config(o: Oracle) -> None:
    if not o.wants("domain/config/V"):
        return
    for field, change, cfg in sweeps.config_changes(SMALL, sweeps.MODEL_FIELDS):
        gpt = _gpt(o, cfg, f"config-w-{field}")
        t = min(cfg.T, 30)
        z = o.randint(cfg.V, 3, t, tag=f"config-ids-{field}")  # (3, t)
        red = max(cfg.d_ff, cfg.C, cfg.V, t)
        about = f"{field} = {change[field]} f64 eval"
        with torch.no_grad():
            _forward(
                o,
                f"domain/config/{field}",
                gpt,
                z,
                (0, 5, t - 1),
                axes=("config",),
                desc=f"GPT B=3 T={t} {about}",
                reduction=red,
            )
        o.call(
            f"domain/config/{field}/generate",
            partial(
                generate,
                gpt,
                z[:, :6],
                _mask((0, 2, 5), 6),
                6,
                temperature=1.0,
                generator=[o.generator(f"{field}{b}") for b in range(3)],
            ),
            desc=f"padded generate t=6 new=6 sampled a row each, {about}",
            stages=7 * cfg.L + 2,
            reduction=red,
            rules=GEN,
            axes=("config",),
        )


def _use() -> Any:
    """``padding_oracle_domain_use.py`` beside this file: modes, grad2, history, errors."""
    path = Path(__file__).with_name("padding_oracle_domain_use.py")
    spec = importlib.util.spec_from_file_location("_padding_oracle_domain_use", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the padding stage's oracle."""
    _magnitude(o)
    _dtypes(o)
    _layout(o)
    _config(o)
    _use().calls(o)
