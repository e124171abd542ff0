"""The fastpath stage's oracle driver (maintainer-owned; run by ``contracts pr``).

``calls(o)`` drives ``FastCausalSelfAttention`` and the switches
``use_fast_attention``/``use_explicit_attention`` with weights and inputs
drawn from the verdict's secret seed: every query-block edge up to 1024 and
drawn lengths, drawn configs, eval, ``inference_mode``, train (invariants
under dropout) and backward, float32, float64 and bfloat16 autocast, with
and without probabilities; a GPT switched to the fast path and back. The
checker compares each answer with the base's.

Stacked with a KV cache (1.1 of this driver, spec 3.3): an attention module,
fast and explicit, float32 and float64, takes its input in cached chunks of
every size 1..``CHUNK`` from every first column, so every chunk size runs at
every cache length 0..41 and 300..319: the fast module plain, with RoPE
``positions`` of a left-padded row, and with a key mask as well (which keeps
a call off the kernel); the explicit module plain. Besides the base's
answers, each cached run must equal the same columns of one uncached call
(an invariant: no second implementation needed).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import fastpath_oracle_domain
import torch
from speckit import model_sweeps as sweeps

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import KVCache
from niels_gpt.model.fastpath import (
    FastCausalSelfAttention,
    use_explicit_attention,
    use_fast_attention,
)
from niels_gpt.model.gpt import GPT

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

COMBOS = ("combos",)  # spec axes these calls sweep (checks/evidence/coverage reads the literals)
ERRORS = ("errors",)

LENGTHS = (1, 2, 127, 128, 129, 255, 256, 257, 511, 512, 513, 767, 1024)
CHUNK = 8  # cached chunks of every size 1..CHUNK
SPANS = ((0, 42), (300, 320))  # the columns fed through the cache: cache lengths 0..41, 300..319
PADS = (0, 5)  # leading pads of the two rows in the positions and masked modes


def _attention(o: Oracle) -> None:
    cfg = ModelConfig(V=2, T=1024, C=16, H=2, dropout=0.0)
    r = o.rng("lengths")
    lengths = sorted({*LENGTHS, *(r.randint(1, 1024) for _ in range(12))})
    for dtype, short in ((torch.float32, "f32"), (torch.float64, "f64")):
        attn = FastCausalSelfAttention(cfg).to(dtype).eval()
        o.load_weights(attn, f"attn-{short}")
        x_all = o.randn(2, 1024, 16, tag=f"x-{short}", dtype=dtype)  # (2, 1024, 16)
        for t in lengths:
            x = x_all[:, :t]  # (2, T, 16)
            with torch.no_grad():
                o.call(
                    f"fast/{short}/T={t}",
                    partial(attn, x),
                    desc=f"B=2 T={t} C=16 {short}",
                    stages=4,
                    reduction=max(16, t),
                )
        with torch.inference_mode():
            o.call(
                f"fast/{short}/probs",
                partial(attn, x_all[:, :300], return_attn=True),
                desc=f"B=2 T=300 {short} return_attn",
                stages=4,
                reduction=300,
            )
    attn = FastCausalSelfAttention(ModelConfig(V=2, T=300, C=32, H=4, dropout=0.3))
    o.load_weights(attn, "train")
    x = o.randn(3, 300, 32, tag="train-x", dtype=torch.float32)  # (3, 300, 32)
    later = x.clone()  # (3, 300, 32)
    later[:, 140:] = 1000.0 * o.randn(3, 160, 32, tag="train-far", dtype=torch.float32)
    attn.train()
    judged = partial(o.call, stages=4, reduction=300)
    judged("train", partial(attn, x), desc="B=3 T=300 C=32 dropout 0.3 train", compare=())
    same = o.equal(("train", "out", ((1, 0, 140),)), ("train-future", "out", ((1, 0, 140),)))
    judged("train-future", partial(attn, later), desc="as train, tokens 140.. x1000", compare=(),
           relations=[same])  # fmt: skip

    def autocast() -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return attn.eval()(x)

    judged(
        "autocast", autocast, desc="B=3 T=300 C=32 bf16 autocast eval", computes_in=torch.bfloat16
    )


def _switch(o: Oracle) -> None:
    cfg = ModelConfig(V=50, T=600, C=32, H=4, L=2, d_ff=64, dropout=0.0)
    gpt = GPT(cfg).eval()
    o.load_weights(gpt, "gpt")
    ids = o.randint(50, 2, 600, tag="ids")  # (2, 600)
    judged = partial(o.call, stages=16, reduction=600)
    use_fast_attention(gpt)
    with torch.no_grad():
        judged("gpt/fast", partial(gpt, ids), desc="GPT L=2 C=32 T=600 fast path eval")
        trace = partial(gpt.forward_with_attn_trace, ids, 1)
        judged("gpt/fast-trace", trace, desc="GPT fast path trace layer 1")
        use_explicit_attention(gpt)
        judged("gpt/explicit", partial(gpt, ids), desc="GPT switched back to explicit")
    not_a_module: Any = torch.zeros(2)
    o.call(
        "bad/switch",
        partial(use_fast_attention, not_a_module),
        desc="not a module",
        stages=1,
        reduction=1,
        axes=ERRORS,
    )


def _frame(mode: str, stop: int) -> dict[str, torch.Tensor]:
    """The keywords of columns ``0 .. stop`` in ``mode``: none, ``positions`` ``(2, stop)``
    counted from each row's first real column, or those and ``key_mask`` ``(2, stop)``."""
    cols = torch.arange(stop)  # (stop,)
    pads = torch.tensor(PADS)[:, None]  # (2, 1)
    frame: dict[str, torch.Tensor] = {}
    if mode != "plain":
        frame["positions"] = (cols[None, :] - pads).clamp(min=0)  # (2, stop)
    if mode == "masked":
        frame["key_mask"] = cols[None, :] >= pads  # (2, stop), True = a real key
    return frame


def _sweep(
    attn: FastCausalSelfAttention,
    x: torch.Tensor,
    frame: dict[str, torch.Tensor],
    n: int,
    start: int,
) -> dict[str, torch.Tensor]:
    """For each first column ``start + j`` (``j < n``): one cached call on columns
    ``0 .. start + j`` (none when empty), then chunks of ``n`` to the end.

    Returns ``o<j>``: the outputs of columns ``start ..`` ``(B, stop - start, C)``.
    """
    B, stop = x.shape[0], x.shape[1]
    out: dict[str, torch.Tensor] = {}
    for j in range(n):
        w = attn.qkv.weight
        attn.kv_cache = KVCache(B, attn.n_head, stop, attn.head_dim, dtype=w.dtype, device=w.device)
        parts, p = [], 0
        for q in (start + j, *range(start + j + n, stop + n, n)):
            q = min(q, stop)
            if q > p:
                keys = {k: v[:, :q] if k == "key_mask" else v[:, p:q] for k, v in frame.items()}
                parts.append(attn(x[:, p:q], **keys))  # (B, q - p, C)
                p = q
        attn.kv_cache = None
        out[f"o{j}"] = torch.cat(parts, dim=1)[:, start:]  # (B, stop - start, C)
    return out


def _cached(o: Oracle) -> None:
    """Fast path x KV cache x positions x key mask: cached chunks of every size at every length."""
    for dtype, short in ((torch.float32, "f32"), (torch.float64, "f64")):
        attn = FastCausalSelfAttention(ModelConfig(V=2, T=320, C=16, H=2, dropout=0.0))
        attn = attn.to(dtype).eval()
        o.load_weights(attn, f"cached-{short}")
        x_all = o.randn(2, 320, 16, tag=f"cached-x-{short}", dtype=dtype)  # (2, 320, 16)
        for fast in (True, False):
            (use_fast_attention if fast else use_explicit_attention)(attn)
            for mode in ("plain", "positions", "masked") if fast else ("plain",):
                for start, stop in SPANS:
                    x, frame = x_all[:, :stop], _frame(mode, stop)  # (2, stop, 16)
                    full = f"cached/{short}/{'fast' if fast else 'explicit'}/{mode}/{start}"
                    about = f"B=2 C=16 {short} {mode} fast={fast}"
                    with torch.no_grad():
                        o.call(
                            full,
                            partial(attn, x, **frame),
                            desc=f"{about} uncached, {stop} columns",
                            stages=4,
                            reduction=max(16, stop),
                            axes=COMBOS,
                        )
                        sweeps.chunk_sweep(o, full, partial(_sweep, attn, x, frame), (start, stop),
                                           CHUNK, about, stages=4, reduction=max(16, stop),
                                           axes=COMBOS)  # fmt: skip
        use_explicit_attention(attn)


def calls(o: Oracle) -> None:
    """Every call of the fastpath stage's oracle, its domain sweeps last."""
    _attention(o)
    _switch(o)
    _cached(o)
    fastpath_oracle_domain.calls(o)
