"""The kv_cache stage's domain sweeps (loaded by ``kv_cache_oracle.calls``; ``domain/...``).

Each call names the spec's ``[oracle].axes`` it sweeps (``contracts check``
refuses the spec when one is never named). The earlier calls already sweep
``combos`` (fast path x cache, ``combos/...``, and the fast-path runs of
``chunks4``/``chunks5``) and part of ``errors`` (``bad/...``), tagged there.
All compared with the base's answers, in float64 unless the axis is the dtype.
The model sweep's table (``speckit.model_sweeps``) feeds the
ids through the cache in chunks, each run paired with the uncached forward
of the same ids (equal, an invariant), and follows it with a generate call:
weights scaled up to x1000 (greedy), a float32 model and one under bfloat16
autocast, every ``ModelConfig`` field away from its default (sampled), eval,
``no_grad`` and ``inference_mode``, every bad argument the spec documents
raising as the base. What is the stage's own:

- magnitude: ``filter_logits`` on logits scaled up to 1e300, where float64 is
  still finite;
- dtype: a float16 and a bfloat16 model generating;
- layout: non-contiguous prompts, cached chunks and logits;
- modes: cached chunks in train (dropout on) and under ``enable_grad``
  (inside ``no_grad``, with a backward); ``generate`` on a model in training
  mode and inside ``enable_grad``;
- grad2: Hessian-vector products of a cached chunk's loss (after a prefill
  through the same cache) with respect to every parameter: the cached forward
  is differentiable in training, though ``generate`` (inference mode) is not;
- history: one model after 600 ``generate`` calls, judged by the next one and
  by its own forward; caches reset 100 times with ``use_kv_cache``; two models
  generating in turn; a model rebuilt from a saved ``state_dict``;
- errors: bad cached chunks, and a float32 cache on a float64 model.
"""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import TYPE_CHECKING, Any, cast

import torch
from speckit import model_sweeps as sweeps

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import (
    KVCache,
    drop_kv_cache,
    filter_logits,
    generate,
    generate_until_eos,
    use_kv_cache,
)

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle


LOGIT_SCALES = (1.0, 1e3, 1e30, 1e300)
GENERATE_CALLS = 600
RESETS = 100
SMALL = ModelConfig(V=13, T=24, C=16, L=2, H=2, d_ff=24, dropout=0.0)
STAGES = sweeps.depth(SMALL)
OWN = sweeps.Scenarios()  # the stage's own scenarios by axis, run after the table's
GEN = ("no-cat-in-generate",)
SIZES = (3, 1, 5)  # the chunks a cached forward feeds, cycled


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


def _pair(o: Oracle, name: str, gpt: GPT, ids: torch.Tensor) -> list[Any]:
    """The table's forward: a cached run of ``ids`` in chunks of 3, 1 and 5
    (``name/cached``) and the uncached forward (``name/full``), equal (an invariant)."""
    same = o.equal((f"{name}/cached", "out", ()), (f"{name}/full", "out", ()))
    return [
        sweeps.Call("/full", partial(gpt, ids), "{}, uncached"),
        sweeps.Call(
            "/cached",
            partial(_cached, gpt, ids, SIZES),
            f"{{}}, cached chunks of {SIZES}",
            {"relations": [same]},
        ),
    ]


def _generate(o: Oracle, name: str, gpt: GPT, ids: torch.Tensor, key: str) -> Any:
    """After each magnitude forward a greedy generate, after each config one a sampled one."""
    if name.startswith("domain/magnitude/"):
        fn, what = partial(generate, gpt, ids[:, :4], 12, temperature=0.0), "greedy, t=4 new=12"
    else:
        fn = partial(generate, gpt, ids[:, :3], 8, temperature=1.0, generator=o.generator(key))
        what = "sampled, t=3 new=8"
    return sweeps.Call("/generate", fn, f"generate {what}, {{}}", {"rules": GEN})


@OWN.axis("magnitude", "domain/magnitude/filter/s=1/top_k")
def _filter_magnitude(o: Oracle) -> None:
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


@OWN.axis("dtype")
def _generate_dtypes(o: Oracle) -> None:
    ids = o.randint(SMALL.V, 2, 20, tag="dtype-ids")  # (2, 20)
    for dtype, short in ((torch.float16, "f16"), (torch.bfloat16, "bf16")):
        if not o.wants(f"domain/dtype/{short}/generate"):
            continue
        gpt = sweeps.model(o, TABLE, SMALL, "dtype-w", dtype)
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


@OWN.axis("layout", "domain/layout/prompt-transposed")
def _layout(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, SMALL, "layout-w")
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
        name = "domain/layout/ids-strided"
        sweeps.judge(o, name, _pair(o, name, gpt, ids), "strided (2, 20) ids, f64 eval",
                     stages=STAGES, reduction=24, axes=("layout",))  # fmt: skip
    o.call(
        "domain/layout/logits-transposed",
        partial(filter_logits, logits, temperature=0.9, top_k=7, top_p=0.9),
        desc="filter_logits on transposed (4, 30) f64 logits",
        stages=3,
        reduction=30,
        axes=("layout",),
    )


def _grad_run(gpt: GPT, ids: torch.Tensor, split: int) -> dict[str, Any]:
    """A prefill of ``ids[:, :split]`` under ``no_grad``, then the rest with gradients:
    its output and the parameter gradients of its sum of squares."""
    gpt.zero_grad()
    use_kv_cache(gpt, ids.shape[0], max_len=ids.shape[1])
    with torch.no_grad():
        gpt(ids[:, :split])
    y = gpt(ids[:, split:])  # (B, t - split, V)
    y.square().sum().backward()
    drop_kv_cache(gpt)
    return {"y": y.detach(), **{n: p.grad for n, p in gpt.named_parameters()}}


@OWN.axis("modes", "domain/modes/train", "domain/modes/train-generate",
          "domain/modes/enable_grad", "domain/modes/enable_grad-generate")  # fmt: skip
def _modes(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, TABLE.modes_config or TABLE.small, "modes-w").train()
    ids = o.randint(SMALL.V, 2, 20, tag="modes-ids")  # (2, 20)
    with torch.no_grad():
        o.call(
            "domain/modes/train",
            partial(_cached, gpt, ids, (4, 1, 7)),
            desc="f64 train (dropout 0.2) under no_grad, cached chunks (4, 1, 7)",
            stages=STAGES,
            reduction=24,
            axes=("modes",),
        )
        o.call(
            "domain/modes/train-generate",
            partial(generate, gpt, ids[:, :4], 10, temperature=0.9, generator=o.generator("tr")),
            desc="generate t=4 new=10 on a model in training mode (dropout 0.2)",
            stages=STAGES,
            reduction=24,
            rules=GEN,
            axes=("modes",),
        )
        sweeps.enable_grad(o, lambda: _grad_run(gpt.eval(), ids, 9), "f64 eval, enable_grad inside "
                           "no_grad: prefill 9, then 11 cached with backward", stages=2 * STAGES,
                           reduction=40)  # fmt: skip

        def generate_grad() -> Any:
            with torch.enable_grad():
                return generate(gpt, ids[:, :3], 8, temperature=0.0)

        o.call(
            "domain/modes/enable_grad-generate",
            generate_grad,
            desc="greedy generate t=3 new=8 inside enable_grad",
            stages=STAGES,
            reduction=24,
            rules=GEN,
            axes=("modes",),
        )


def _prefilled(gpt: GPT, ids: torch.Tensor, split: int) -> torch.Tensor:
    """The logits (B, t - split, V) of ``ids[:, split:]``, cached after a prefill of ``split``."""
    use_kv_cache(gpt, ids.shape[0], max_len=ids.shape[1])
    with torch.no_grad():
        gpt(ids[:, :split])
    logits: torch.Tensor = gpt(ids[:, split:])  # (B, t - split, V)
    drop_kv_cache(gpt)
    return logits


@OWN.axis("grad2", "domain/grad2/cached-loss")
def _grad2(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, SMALL, "grad2-w").train()
    ids = o.randint(SMALL.V, 2, 16, tag="grad2-ids")  # (2, 16)
    o.call(
        "domain/grad2/cached-loss",
        partial(sweeps.cross_entropy_hvp, o, gpt, partial(_prefilled, gpt, ids, 10), "grad2"),
        desc="GPT B=2 f64 train: prefill 10, 6 cached with cross-entropy: H v (parameters)",
        stages=4 * STAGES,
        reduction=48,
        axes=("grad2",),
    )


@OWN.axis("history", "domain/history/long/generate")
def _history(o: Oracle) -> None:
    cfg = ModelConfig(V=7, T=12, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    gpt = sweeps.model(o, TABLE, cfg, "hist-w")
    prompt = o.randint(cfg.V, 2, 3, tag="hist-prompt")  # (2, 3)

    def warm_up() -> None:
        g = o.generator("hist-many")
        for i in range(GENERATE_CALLS):  # one model generating many times
            generate(gpt, prompt, 1 + i % 2, temperature=1.0, generator=g)
        for _ in range(RESETS):  # caches set up again and again, one step each
            use_kv_cache(gpt, 2)
            with torch.no_grad():
                gpt(prompt[:, :1])
        drop_kv_cache(gpt)

    sweeps.one_thread(warm_up)
    about = f"after {GENERATE_CALLS} generate calls and {RESETS} cache resets"
    o.call(
        "domain/history/long/generate",
        partial(generate, gpt, prompt, 9, temperature=1.0, generator=o.generator("hist-g")),
        desc=f"generate t=3 new=9 sampled, f64, {about}",
        stages=9,
        reduction=12,
        rules=GEN,
        axes=("history",),
    )
    with torch.no_grad():
        ids = o.randint(cfg.V, 2, 12, tag="hist-ids")  # (2, 12)
        name = "domain/history/long"
        sweeps.judge(o, name, _pair(o, name, gpt, ids), f"f64 eval {about}", stages=9,
                     reduction=12, axes=("history",))  # fmt: skip
    o.call(
        "domain/history/reloaded",
        partial(generate, sweeps.reloaded(TABLE, gpt, cfg), prompt, 9, temperature=0.0),
        desc="greedy generate on a fresh model loaded from a saved state_dict",
        stages=9,
        reduction=12,
        rules=GEN,
        axes=("history",),
    )
    other = sweeps.model(o, TABLE, dataclasses.replace(cfg, V=11, C=12, H=3, T=16), "hist-w2")
    sweeps.in_turn(
        o,
        (gpt, prompt),
        (other, o.randint(11, 1, 4, tag="hist-prompt2")),  # (1, 4)
        lambda m, z, key: partial(
            generate, m, z, 6, temperature=1.0, generator=o.generator(f"il{key}")
        ),
        desc="two models generating in turn, round {round}, model {who}, sampled f64",
        stages=9,
        reduction=16,
        rules=GEN,
    )


ERRORS_CFG = ModelConfig(V=10, T=8, C=16, H=2, L=2, d_ff=16)


def _errors(o: Oracle) -> dict[str, Any]:
    gpt = sweeps.model(o, TABLE, ERRORS_CFG, "errors-w", torch.float32)
    ok = torch.zeros(2, 3, dtype=torch.int64)  # (2, 3)
    cpu = torch.device("cpu")
    return {
        "model-not-gpt": partial(generate, cast(Any, gpt.blocks[0]), ok, 1),
        "prompt-rank1": partial(generate, gpt, ok[0], 1),
        "prompt-int32": partial(generate, gpt, ok.int(), 1),
        "prompt-meta": partial(generate, gpt, ok.to("meta"), 1),
        "prompt-empty": partial(generate, gpt, ok[:, :0], 1),
        "prompt-empty-batch": partial(generate, gpt, ok[:0], 1),
        "ids-out-of-range": partial(generate, gpt, ok + 10, 1),
        "ids-negative": partial(generate, gpt, ok - 1, 1),
        "new-negative": partial(generate, gpt, ok, -1),
        "new-bool": partial(generate, gpt, ok, True),
        "new-float": partial(generate, gpt, ok, cast(Any, 2.0)),
        "temperature-nan": partial(generate, gpt, ok, 1, temperature=float("nan")),
        "temperature-bool": partial(generate, gpt, ok, 1, temperature=True),
        "top_k-zero": partial(generate, gpt, ok, 1, top_k=0),
        "top_k-bool": partial(generate, gpt, ok, 1, top_k=True),
        "top_p-over-one": partial(generate, gpt, ok, 1, top_p=1.5),
        "eos-out-of-range": partial(generate, gpt, ok, 1, eos_id=10),
        "generator-not-one": partial(generate, gpt, ok, 1, generator=cast(Any, 3)),
        "generators-short": partial(generate, gpt, ok, 1, generator=[torch.Generator()]),
        "trace-layer-past": partial(generate, gpt, ok, 1, trace_layer=2),
        "until-eos-no-eos": partial(generate_until_eos, gpt, ok, 1, eos_id=cast(Any, None)),
        "filter-int-logits": partial(filter_logits, torch.zeros(2, 5, dtype=torch.int64)),
        "filter-0d-logits": partial(filter_logits, torch.tensor(1.0)),
        "filter-top_p-zero": partial(filter_logits, torch.zeros(2, 5), top_p=0.0),
        "use-max_len-zero": partial(use_kv_cache, gpt, 1, max_len=0),
        "use-max_len-past-T": partial(use_kv_cache, gpt, 1, max_len=9),
        "use-batch-bool": partial(use_kv_cache, gpt, True),
        "use-no-attention": partial(use_kv_cache, torch.nn.Linear(2, 2), 1),
        "cache-zero-heads": partial(KVCache, 1, 0, 8, 4, dtype=torch.float32, device=cpu),
        "cache-float-len": partial(
            KVCache, 1, 2, cast(Any, 8.0), 4, dtype=torch.float32, device=cpu
        ),
    }


@OWN.axis("errors")
def _cache_errors(o: Oracle) -> None:
    gpt = sweeps.model(o, TABLE, ERRORS_CFG, "errors-w", torch.float32)
    ok = torch.zeros(2, 3, dtype=torch.int64)  # (2, 3)
    use_kv_cache(gpt, 2, max_len=4)
    with torch.no_grad():
        gpt(ok)
        chunks = {"chunk-past-max_len": ok[:, :2], "chunk-int32": ok[:, :1].int()}
        sweeps.errors(o, {w: partial(gpt, z) for w, z in chunks.items()}, "bad cached chunk")
        gpt64 = sweeps.model(o, TABLE, ERRORS_CFG, "errors-w")
        use_kv_cache(gpt64, 2)
        ours = [m for m in gpt.modules() if isinstance(getattr(m, "kv_cache", None), KVCache)]
        theirs = [m for m in gpt64.modules() if isinstance(getattr(m, "kv_cache", None), KVCache)]
        for mine, other in zip(ours, theirs, strict=True):
            other.kv_cache = mine.kv_cache  # a float32 cache on a float64 model
        sweeps.errors(o, {"cache-dtype-mismatch": partial(gpt64, ok[:, :1])},
                      "a float32 cache on a float64 model")  # fmt: skip
    drop_kv_cache(gpt)


TABLE = sweeps.ModelSweep(
    build=GPT,
    small=SMALL,
    forward=_pair,
    suffixes=("/full", "/cached"),
    dtypes={"f32": (torch.float32, None), "autocast-bf16": (torch.float32, torch.bfloat16)},
    modes=("eval", "no_grad", "inference_mode"),
    modes_config=dataclasses.replace(SMALL, dropout=0.2),
    after=_generate,
    errors=_errors,
    scenarios=OWN,
)


def calls(o: Oracle) -> None:
    """Every ``domain/...`` call of the kv_cache stage's oracle."""
    sweeps.model_sweeps(o, TABLE)
