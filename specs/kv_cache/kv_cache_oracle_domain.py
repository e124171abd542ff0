"""The kv_cache stage's domain sweeps (spec 4.6, issue 28; maintainer-owned).

``calls(o)`` runs after the driver's earlier calls (``kv_cache_oracle.py``
chains it), one call group per axis the spec declares in
``[oracle].axes``; each call names the axis it sweeps (``contracts check``
refuses the spec when one is never named). The earlier calls already sweep
``combos`` (fast path x cache, ``combos/...``, and the fast-path runs of
``chunks4``/``chunks5``) and part of ``errors`` (``bad/...``), tagged there.
All compared with the base's answers, in float64 unless the axis is the dtype;
cached chunks also equal the uncached forward of the same ids (an invariant):

- magnitude: weights scaled by 1, 10, 30, 100 and 1000 (cached chunks and
  greedy generate); ``filter_logits`` on logits scaled up to 1e300, where
  float64 is still finite;
- dtype: float32 and float64 models fed through the cache, a float32 model
  cached under bfloat16 autocast, a float16 and a bfloat16 model generating;
- layout: non-contiguous prompts, cached chunks and logits;
- config: every ``ModelConfig`` field away from its default, fed through the
  cache and generating;
- modes: cached chunks in train (dropout on) and eval, under ``no_grad``,
  ``inference_mode`` and ``enable_grad`` (inside ``no_grad``, with a
  backward); ``generate`` on a model in training mode and inside
  ``enable_grad``;
- grad2: Hessian-vector products of a cached chunk's loss (after a prefill
  through the same cache) with respect to every parameter: the cached forward
  is differentiable in training, though ``generate`` (inference mode) is not;
- history: one model after 600 ``generate`` calls, judged by the next one and
  by its own forward; caches reset 200 times with ``use_kv_cache``; two models
  generating in turn; a model rebuilt from a saved ``state_dict``;
- errors: every bad argument the spec documents raises as the base raises it.
"""

from __future__ import annotations

import importlib.util
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.blocks import Block
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import (
    drop_kv_cache,
    filter_logits,
    generate,
    use_kv_cache,
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
LOGIT_SCALES = (1.0, 1e3, 1e30, 1e300)
GENERATE_CALLS = 600
RESETS = 100
SMALL = ModelConfig(V=13, T=24, C=16, L=2, H=2, d_ff=24, dropout=0.0)
STAGES = 7 * SMALL.L + 2
GEN = ("no-cat-in-generate",)


def _gpt(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype = torch.float64) -> GPT:
    gpt = GPT(cfg).to(dtype).eval()
    o.load_weights(gpt, tag)
    return gpt


def _bound(gpt: GPT, ids: torch.Tensor) -> int:
    """An upper bound of every attention score ``|q . k| / sqrt(D)`` of ``gpt`` on ``ids``
    (uncached: call it before any cache is set up)."""
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


def _cached(gpt: GPT, ids: torch.Tensor, sizes: tuple[int, ...]) -> dict[str, torch.Tensor]:
    """``ids`` (B, t) fed through fresh caches in chunks of ``sizes`` (cycled); the logits
    of every chunk joined (``out``, (B, t, V)), then the caches dropped."""
    B, t = ids.shape
    use_kv_cache(gpt, B, max_len=t)
    parts, p, i = [], 0, 0
    while p < t:
        n = min(sizes[i % len(sizes)], t - p)
        parts.append(gpt(ids[:, p : p + n]))  # (B, n, V)
        p, i = p + n, i + 1
    drop_kv_cache(gpt)
    return {"out": torch.cat(parts, dim=1)}  # (B, t, V)


def _pair(
    o: Oracle,
    name: str,
    gpt: GPT,
    ids: torch.Tensor,
    *,
    axes: tuple[str, ...],
    desc: str,
    reduction: int,
    sizes: tuple[int, ...] = (3, 1, 5),
    computes_in: torch.dtype | None = None,
) -> None:
    """A cached run of ``ids`` and the uncached forward, equal to each other (an invariant)."""
    stages = 7 * gpt.cfg.L + 2
    o.call(
        f"{name}/full",
        partial(gpt, ids),
        desc=f"{desc}, uncached",
        stages=stages,
        reduction=reduction,
        computes_in=computes_in,
        axes=axes,
    )
    o.call(
        f"{name}/cached",
        partial(_cached, gpt, ids, sizes),
        desc=f"{desc}, cached chunks of {sizes}",
        stages=stages,
        reduction=reduction,
        computes_in=computes_in,
        axes=axes,
        relations=[o.equal((f"{name}/cached", "out", ()), (f"{name}/full", "out", ()))],
    )


def _magnitude(o: Oracle) -> None:
    if not o.wants("domain/magnitude/s=1/full"):
        return
    ids = o.randint(SMALL.V, 2, 20, tag="mag-ids")  # (2, 20)
    for s in SCALES:
        gpt = GPT(SMALL).double().eval()
        o.load_weights(gpt, "mag-gpt", scale=s / SMALL.C**0.5)  # weights x s
        m = max(SMALL.d_ff, SMALL.V, 20, _bound(gpt, ids))
        about = f"GPT B=2 T=20 C=16 L=2 f64 eval, weights x{s:g}"
        with torch.no_grad():
            _pair(o, f"domain/magnitude/s={s:g}", gpt, ids, axes=("magnitude",), desc=about,
                  reduction=m)  # fmt: skip
        o.call(
            f"domain/magnitude/s={s:g}/generate",
            partial(generate, gpt, ids[:, :4], 12, temperature=0.0),
            desc=f"greedy generate t=4 new=12, {about}",
            stages=STAGES,
            reduction=m,
            rules=GEN,
            axes=("magnitude",),
        )
    logits = o.randn(3, 40, tag="mag-logits")  # (3, 40)
    for s in LOGIT_SCALES:
        choices: tuple[dict[str, Any], ...] = (
            {"temperature": 0.7, "top_k": 5},
            {"temperature": 1.3, "top_p": 0.8},
        )
        for knobs in choices:
            o.call(
                f"domain/magnitude/filter/s={s:g}/{'top_k' if 'top_k' in knobs else 'top_p'}",
                partial(filter_logits, s * logits, **knobs),
                desc=f"filter_logits (3, 40) f64 logits x{s:g} {knobs}",
                stages=3,
                reduction=40,
                axes=("magnitude",),
            )


def _dtypes(o: Oracle) -> None:
    if not o.wants("domain/dtype/f32/full"):
        return
    ids = o.randint(SMALL.V, 2, 20, tag="dtype-ids")  # (2, 20)
    gpt32 = _gpt(o, SMALL, "dtype-w", torch.float32)
    with torch.no_grad():
        _pair(o, "domain/dtype/f32", gpt32, ids, axes=("dtype",), desc="f32 model eval",
              reduction=24)  # fmt: skip
        with torch.autocast("cpu", dtype=torch.bfloat16):
            _pair(o, "domain/dtype/autocast-bf16", gpt32, ids, axes=("dtype",), reduction=24,
                  desc="f32 model under bfloat16 autocast", computes_in=torch.bfloat16)  # fmt: skip
    for dtype, short in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
        gpt = _gpt(o, SMALL, "dtype-w", dtype)
        o.call(
            f"domain/dtype/{short}/generate",
            partial(generate, gpt, ids[:, :5], 10, temperature=1e-4, generator=o.generator(short)),
            desc=f"{short} model, generate t=5 new=10 at temperature 1e-4",
            stages=STAGES,
            reduction=24,
            rules=GEN,
            computes_in=dtype,
            axes=("dtype",),
        )


def _layout(o: Oracle) -> None:
    if not o.wants("domain/layout/prompt-transposed"):
        return
    gpt = _gpt(o, SMALL, "layout-w")
    prompt = o.randint(SMALL.V, 6, 2, tag="layout-prompt").t()  # (2, 6), non-contiguous
    ids = o.randint(SMALL.V, 2, 40, tag="layout-ids")[:, ::2]  # (2, 20), strided
    logits = o.randn(30, 4, tag="layout-logits").t()  # (4, 30), non-contiguous
    o.call(
        "domain/layout/prompt-transposed",
        partial(generate, gpt, prompt, 9, temperature=0.8, generator=o.generator("layout")),
        desc="generate from a transposed (2, 6) prompt, sampled, f64",
        stages=STAGES,
        reduction=24,
        rules=GEN,
        axes=("layout",),
    )
    with torch.no_grad():
        _pair(o, "domain/layout/ids-strided", gpt, ids, axes=("layout",), reduction=24,
              desc="strided (2, 20) ids, f64 eval")  # fmt: skip
    o.call(
        "domain/layout/logits-transposed",
        partial(filter_logits, logits, temperature=0.9, top_k=7, top_p=0.9),
        desc="filter_logits on transposed (4, 30) f64 logits",
        stages=3,
        reduction=30,
        axes=("layout",),
    )


def _config(o: Oracle) -> None:
    if not o.wants("domain/config/V/full"):
        return
    for field, change, cfg in sweeps.config_changes(SMALL, sweeps.MODEL_FIELDS):
        gpt = _gpt(o, cfg, f"config-w-{field}")
        t = min(cfg.T, 30)
        z = o.randint(cfg.V, 2, t, tag=f"config-ids-{field}")  # (2, t)
        red = max(cfg.d_ff, cfg.C, cfg.V, t)
        about = f"{field} = {change[field]} f64 eval"
        with torch.no_grad():
            _pair(o, f"domain/config/{field}", gpt, z, axes=("config",), reduction=red,
                  desc=f"GPT B=2 T={t} {about}")  # fmt: skip
        o.call(
            f"domain/config/{field}/generate",
            partial(generate, gpt, z[:, :3], 8, temperature=1.0, generator=o.generator(field)),
            desc=f"generate t=3 new=8 sampled, {about}",
            stages=7 * cfg.L + 2,
            reduction=red,
            rules=GEN,
            axes=("config",),
        )


def _use() -> Any:
    """``kv_cache_oracle_domain_use.py`` beside this file: modes, grad2, history, errors."""
    path = Path(__file__).with_name("kv_cache_oracle_domain_use.py")
    spec = importlib.util.spec_from_file_location("_kv_cache_oracle_domain_use", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the kv_cache stage's oracle."""
    _magnitude(o)
    _dtypes(o)
    _layout(o)
    _config(o)
    _use().calls(o)
