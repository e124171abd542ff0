"""The kv_cache stage's oracle driver (maintainer-owned; run by ``contracts pr``).

``calls(o)`` drives the stage's public API with weights, ids and knobs drawn
from the verdict's secret seed:

- cached forwards: a GPT switched with ``use_kv_cache`` (two of six runs also
  with ``use_fast_attention``: the fast path's kernel on a cache) is fed its context in
  chunks of drawn sizes (1 to 64 tokens, sometimes up to the rest of the
  context) until the cache holds ``cfg.T`` positions, so calls land at many
  cache lengths and chunk sizes; each chunk's logits are compared with the
  base's and, as an invariant, with the uncached forward of the same ids
  (``drop_kv_cache`` first); the same for cached traces, one token a step;
- ``generate`` in float64 (greedy, temperature, top-k, top-p, eos, a seeded
  generator, traces; explicit and fast-path models): the ids must be equal;
  the first one always runs to the end of a 200-token context (every cache
  length a decode step can have there), sampled at temperature 1 and traced,
  so a wrong cache shows in the traces even where the ids agree;
- ``filter_logits`` on drawn logits and knobs; ``KVCache`` itself; bad
  arguments, whose exception type must match the base's;
- stacked (1.1 of this driver, spec 4.4): explicit and fast-path models,
  float32 and float64, fed in cached chunks of every size 1..``CHUNK`` from
  every first column, so every chunk size runs at every cache length 0..41
  and 300..319, each run equal to the same columns of one uncached forward
  (an invariant); ``generate`` greedy and sampled with a given generator on
  both models through the same cache lengths, the fast model's ids equal to
  the explicit model's in float64 (an invariant).

Size (13.0 of the spec): ``filter_logits`` on two rows of float32 logits over
GPT-2 small's vocabulary (V = 50257) and over one drawn wide by the secret
seed (``speckit.sizes``, V to 131072), with GPT-2's usual sampling knobs
(temperature 0.8, top_k 50, top_p 0.9) and with knobs drawn as ``filter/*``'s.

Single-token cached steps fall under ``no-cat-on-decode`` and ``generate``
calls under ``no-cat-in-generate`` (their ops are recorded).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import kv_cache_oracle_domain
import torch
from speckit import model_sweeps as sweeps
from speckit import sizes

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import (
    KVCache,
    drop_kv_cache,
    filter_logits,
    generate,
    use_kv_cache,
)

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

DECODE, GENERATE = ("no-cat-on-decode",), ("no-cat-in-generate",)
COMBOS = ("combos",)  # spec axes these calls sweep (checks/evidence/coverage reads the literals)
ERRORS = ("errors",)
CHUNK = 8  # cached chunks of every size 1..CHUNK
SPANS = ((0, 42), (300, 320))  # columns fed through the cache: cache lengths 0..41, 300..319


def _gpt(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype) -> GPT:
    gpt = GPT(cfg).to(dtype).eval()
    o.load_weights(gpt, tag)
    return gpt


def _chunks(o: Oracle, run: int) -> None:
    """One context fed in drawn chunks through the cache, then uncached; runs 4 and 5
    on a fast-path model (its kernel then serves every cached chunk)."""
    r = o.rng(f"chunks{run}")
    big = run == 0
    cfg = ModelConfig(
        V=r.choice((61, 300)),
        T=1024 if big else r.choice((128, 256)),
        C=r.choice((16, 32)),
        H=2,
        L=r.randint(1, 2),
        d_ff=48,
        dropout=r.choice((0.0, 0.2)),  # dropout is off in eval: the knob must not leak in
        rope_theta=r.choice((10000.0, 300.0)),
    )
    dtype = torch.float64 if run % 2 else torch.float32
    gpt = _gpt(o, cfg, f"chunks{run}-w", dtype)
    fast = run >= 4
    if fast:
        use_fast_attention(gpt)
    b = r.randint(1, 3)
    ids = o.randint(cfg.V, b, cfg.T, tag=f"chunks{run}-ids")  # (B, T)
    name = f"chunks{run}"
    about = f"B={b} V={cfg.V} C={cfg.C} L={cfg.L} cfg.T={cfg.T} {dtype} fast={fast}"
    spans: list[tuple[int, int]] = []
    use_kv_cache(gpt, b)
    p = 0
    with torch.no_grad():
        while p < cfg.T:
            n = min(cfg.T - p, r.choice((1, 1, 2, 3, 7, 16, 33, 64, r.randint(1, cfg.T))))
            step = f"{name}/p={p}/n={n}"
            rules = DECODE if n == 1 else ()
            o.call(
                step,
                partial(gpt, ids[:, p : p + n]),
                desc=f"{about} cached, {n} tokens after {p}",
                stages=7 * cfg.L + 2,
                reduction=max(cfg.C, p + n, 48),
                rules=rules,
            )
            spans.append((p, n))
            p += n
        # the model and its full caches: within 1.25x of the base's (oracle.memory)
        o.held(f"{name}/held", gpt, desc=f"{about} model and caches at p={cfg.T}")
        drop_kv_cache(gpt)
        same = [
            o.equal((f"{name}/p={p}/n={n}", "out", ()), (f"{name}/full", "out", ((1, p, p + n),)))
            for p, n in spans
        ]
        o.call(
            f"{name}/full",
            partial(gpt, ids),
            desc=f"{about} uncached, all {cfg.T}",
            stages=7 * cfg.L + 2,
            reduction=max(cfg.C, cfg.T, 48),
            relations=same,
        )


def _traces(o: Oracle) -> None:
    cfg = ModelConfig(V=50, T=160, C=16, H=2, L=2, d_ff=32, dropout=0.0)
    gpt = _gpt(o, cfg, "traces-w", torch.float64)
    ids = o.randint(50, 2, 160, tag="traces-ids")  # (2, 160)
    use_kv_cache(gpt, 2)
    with torch.no_grad():
        o.call(
            "traces/prefill",
            partial(gpt.forward_with_attn_trace, ids[:, :130], 1),
            desc="cached trace, prefill of 130",
            stages=16,
            reduction=130,
        )
        for p in range(130, 160):
            o.call(
                f"traces/p={p}",
                partial(gpt.forward_with_attn_trace, ids[:, p : p + 1], 0),
                desc=f"cached trace, one token after {p}",
                stages=16,
                reduction=p + 1,
                rules=DECODE,
            )
    drop_kv_cache(gpt)


def _generate(o: Oracle) -> None:
    r = o.rng("generate")
    for i in range(6):
        long = i == 0  # one generation to the end of a long context: every cache length
        cfg = ModelConfig(
            V=r.choice((7, 64, 300)),
            T=200 if long else r.choice((40, 200)),
            C=16,
            H=2,
            L=2,
            d_ff=32,
            dropout=0.1,
        )
        gpt = _gpt(o, cfg, f"gen{i}-w", torch.float64)
        if i % 3 == 2:
            use_fast_attention(gpt)
        b, t = r.randint(1, 3), r.randint(1, cfg.T // (5 if long else 2))
        new = cfg.T - t if long else r.randint(0, cfg.T - t)
        prompt = o.randint(cfg.V, b, t, tag=f"gen{i}-prompt")  # (B, t)
        knobs: dict[str, Any] = {
            "temperature": r.choice((0.0, 1.0, 0.7, 1e-4)),
            "top_k": r.choice((None, 1, 5)),
            "top_p": r.choice((None, 0.9, 0.3)),
            "eos_id": r.choice((None, 0, 3)),
            "generator": o.generator(f"gen{i}-draws"),
            "trace_layer": r.choice((None, 1)),
        }
        if long:  # sampled (a greedy random model may repeat one token) and traced
            knobs.update(temperature=1.0, top_k=None, top_p=None, eos_id=None, trace_layer=1)
        about = ", ".join(f"{k}={v}" for k, v in knobs.items() if k != "generator")
        run = partial(generate, gpt, prompt, new, **knobs)
        desc = f"generate V={cfg.V} B={b} t={t} new={new} {about}"
        sweeps.handed_back(o, f"generate/{i}", run, gpt, prompt, desc=desc, stages=16,
                           reduction=cfg.T, rules=GENERATE)  # fmt: skip


def _filters_and_bad(o: Oracle) -> None:
    r = o.rng("filters")
    for i in range(8):
        logits = 3.0 * o.randn(
            r.randint(1, 4),
            r.choice((1, 2, 50, 1000)),
            tag=f"logits{i}",
            dtype=r.choice((torch.float32, torch.float64)),
        )
        knobs: dict[str, Any] = {
            "temperature": r.choice((1.0, 0.5, 0.0, 2.0)),
            "top_k": r.choice((None, 1, 10)),
            "top_p": r.choice((None, 1.0, 0.5, 0.01)),
        }
        o.call(
            f"filter/{i}",
            partial(filter_logits, logits, **knobs),
            desc=f"filter_logits {tuple(logits.shape)} {knobs}",
            stages=2,
            reduction=logits.shape[-1],
        )
    gpt = _gpt(o, ModelConfig(V=10, T=8, C=16, H=2, L=1, d_ff=16), "bad-w", torch.float32)
    prompt = torch.zeros(1, 4, dtype=torch.int64)  # (1, 4)
    cases: dict[str, Any] = {
        "cache-bool": partial(
            KVCache, True, 2, 8, 4, dtype=torch.float32, device=torch.device("cpu")
        ),
        "cache-len": partial(
            lambda: len(KVCache(2, 2, 8, 4, dtype=torch.float64, device=torch.device("cpu")))
        ),
        "too-long": partial(generate, gpt, prompt, 5),
        "temperature": partial(generate, gpt, prompt, 1, temperature=-1.0),
        "top_p": partial(generate, gpt, prompt, 1, top_p=0.0),
        "batch": partial(use_kv_cache, gpt, 0),
    }
    for what, fn in cases.items():
        o.call(f"bad/{what}", fn, desc=f"bad argument: {what}", stages=1, reduction=1, axes=ERRORS)
    chunks = {  # bad cached chunks, after a prompt of 4 in a cache for one row
        "past-T": ("a cached chunk past cfg.T", torch.zeros(1, 5, dtype=torch.int64)),
        "batch-mismatch": ("a cached chunk of another batch", torch.zeros(2, 1, dtype=torch.int64)),
    }
    use_kv_cache(gpt, 1)
    with torch.no_grad():
        gpt(prompt)
        for what, (desc, z) in chunks.items():
            o.call(f"bad/{what}", partial(gpt, z), desc=desc, stages=1, reduction=1, axes=ERRORS)


def _sweep(gpt: GPT, ids: torch.Tensor, n: int, start: int) -> dict[str, torch.Tensor]:
    """For each first column ``start + j`` (``j < n``): a fresh cache, one call on
    columns ``0 .. start + j`` (none when empty), then chunks of ``n`` to the end.

    Returns ``o<j>``: the logits of columns ``start ..`` ``(B, stop - start, V)``.
    """
    B, stop = ids.shape
    out: dict[str, torch.Tensor] = {}
    for j in range(n):
        use_kv_cache(gpt, B, max_len=stop)
        parts, p = [], 0
        for q in (start + j, *range(start + j + n, stop + n, n)):
            q = min(q, stop)
            if q > p:
                parts.append(gpt(ids[:, p:q]))  # (B, q - p, V)
                p = q
        drop_kv_cache(gpt)
        out[f"o{j}"] = torch.cat(parts, dim=1)[:, start:]  # (B, stop - start, V)
    return out


def _combos(o: Oracle) -> None:
    """Fast path x KV cache: cached chunks of every size at every length, and generate."""
    cfg = ModelConfig(V=29, T=320, C=16, H=2, L=1, d_ff=32, dropout=0.0)
    ids = o.randint(29, 2, 320, tag="combos-ids")  # (2, 320)
    for dtype, short in ((torch.float32, "f32"), (torch.float64, "f64")):
        for fast in (False, True):
            gpt = _gpt(o, cfg, f"combos-{short}-w", dtype)  # the same weights for both paths
            if fast:
                use_fast_attention(gpt)
            kind = "fast" if fast else "explicit"
            with torch.no_grad():
                for start, stop in SPANS:
                    full, z = f"combos/{short}/{kind}/{start}", ids[:, :stop]  # z: (2, stop)
                    o.call(
                        full,
                        partial(gpt, z),
                        desc=f"{short} {kind} uncached, {stop} columns",
                        stages=9,
                        reduction=max(48, stop),
                        axes=COMBOS,
                    )
                    sweeps.chunk_sweep(o, full, partial(_sweep, gpt, z), (start, stop), CHUNK,
                                       f"{short} {kind}", stages=9, reduction=max(48, stop),
                                       axes=COMBOS)  # fmt: skip
            for t, new in ((2, 42), (300, 20)):
                for sampled in (False, True):
                    tag = f"combos/{short}/gen-t={t}/{'sampled' if sampled else 'greedy'}"
                    exact = fast and dtype == torch.float64  # no rounding flips a draw
                    o.call(
                        f"{tag}/{kind}",
                        partial(
                            generate,
                            gpt,
                            ids[:, :t],
                            new,
                            temperature=1.0 if sampled else 0.0,
                            generator=o.generator(f"{tag}-draws"),
                        ),
                        desc=f"generate {short} {kind} B=2 t={t} new={new} sampled={sampled}",
                        stages=9,
                        reduction=cfg.T,
                        rules=GENERATE,
                        axes=COMBOS,
                        relations=[
                            o.equal((f"{tag}/fast", "out", ()), (f"{tag}/explicit", "out", ()))
                        ]
                        if exact
                        else (),
                    )


def _sizes(o: Oracle) -> None:
    """``size``: ``filter_logits`` on ``(2, V)`` float32 logits at each of ``sizes.real_sizes``."""
    for size in sizes.real_sizes(o, "size"):
        r = o.rng(f"size-filter-{size.name}")
        drawn: dict[str, Any] = {
            "temperature": r.choice((1.0, 0.5, 0.0, 2.0)),
            "top_k": r.choice((None, 1, 10, 1000)),
            "top_p": r.choice((None, 1.0, 0.5, 0.01)),
        }
        usual: dict[str, Any] = {"temperature": 0.8, "top_k": 50, "top_p": 0.9}
        tag = f"size-logits-{size.name}"
        logits = 3.0 * o.randn(2, size.V, tag=tag, dtype=torch.float32)  # (2, V)
        for label, knobs in (("usual", usual), ("drawn", drawn)):
            o.call(
                f"size/filter/{size.name}/{label}",
                partial(filter_logits, logits, **knobs),
                desc=f"filter_logits (2, {size.V}) float32 {knobs}, {size.name} sizes",
                stages=2,
                reduction=size.V,
                axes=("size",),
            )


def calls(o: Oracle) -> None:
    """Every call of the kv_cache stage's oracle, its domain sweeps last."""
    for run in range(6):
        _chunks(o, run)
    _traces(o)
    _generate(o)
    _filters_and_bad(o)
    _combos(o)
    kv_cache_oracle_domain.calls(o)
    _sizes(o)
