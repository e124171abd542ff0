"""The attention oracle's calls of attention 1.1: positions, key masks, a KV cache.

Loaded by ``attention_oracle.calls`` (maintainer-owned; run by ``contracts
pr``). Every call is named ``v2/...``; ``specs/attention.toml`` sends these
to the float64 reference (``reference_calls``), the calls an amended spec
added. Domain, drawn from the verdict's secret seed, in float64 and float32,
eval mode:

- per-row ``positions``: left-padded frames (``(col - pads).clamp(0)``) and
  positions drawn anywhere in ``[0, cfg.T)``;
- ``key_mask``: all keys, left pads, keys drawn at random, rows whose first
  queries see no key at all (a zero row, never NaN), with and without
  positions;
- a ``KVCache``: a context fed in chunks of drawn sizes (1 to 200 tokens)
  until the cache holds ``cfg.T`` positions, so chunks land
  at every region of cache lengths (past 96, past 512 in the long run); once
  plainly and once in a left-padded frame (positions and a key mask a chunk);
  each chunk also equals, as an invariant, the same columns of one uncached
  call;
- bad calls: positions or a key mask of another dtype, shape or range, a
  cache of another batch or dtype, or too short (the error type must match).

Every call falls under ``no-sdpa-extended`` (its ATen ops are recorded).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

RULES = ("no-sdpa-extended",)
PROBS = 1 << 18  # most probabilities one call returns


def _module(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype) -> CausalSelfAttention:
    attn = CausalSelfAttention(cfg).to(dtype).eval()
    o.load_weights(attn, tag)
    return attn


def _pads(o: Oracle, tag: str, b: int, t: int) -> torch.Tensor:
    """Leading pads a row: none, many, all but one, drawn; ``(B,)`` int64."""
    r = o.rng(tag)
    pads = [0, r.randint(t // 2, t - 1), t - 1, *(r.randint(0, t - 1) for _ in range(b))]
    return torch.tensor(pads[:b], dtype=torch.int64)


def _frame(pads: torch.Tensor, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``positions`` ``(B, hi-lo)`` of columns ``[lo, hi)`` and ``key_mask`` ``(B, hi)``."""
    cols = torch.arange(hi)  # (hi,)
    return (cols[None, lo:] - pads[:, None]).clamp(min=0), cols[None, :] >= pads[:, None]


def _y(probs: int) -> str:
    """The output key of ``y`` in a call that returns ``probs`` probabilities or fewer."""
    return "0" if probs <= PROBS else "out"


def _one_call(o: Oracle, attn: CausalSelfAttention, name: str, desc: str, **kw: Any) -> None:
    x = kw.pop("x")
    b, t, _ = x.shape
    cache = getattr(attn, "kv_cache", None)
    m = t + (0 if cache is None else len(cache))
    probs = b * attn.n_head * t * m <= PROBS
    with torch.no_grad():
        o.call(
            name,
            partial(attn, x, return_attn=probs, **kw),
            desc=f"{desc}{' probs' if probs else ''}",
            stages=4,
            reduction=max(attn.cfg.C, m),
            rules=RULES,
        )


def _rows(o: Oracle, dtype: torch.dtype, short: str) -> None:
    """Positions and key masks, uncached."""
    r = o.rng(f"v2/{short}/rows")
    cfg = ModelConfig(V=2, T=r.choice((64, 300, 1024)), C=32, H=4, dropout=0.0)
    attn = _module(o, cfg, f"v2-rows-w-{short}", dtype)
    for i in range(6):
        b = r.randint(2, 4)
        t = r.choice((1, 2, 129, r.randint(1, cfg.T), cfg.T)) if i else cfg.T
        x = o.randn(b, t, cfg.C, tag=f"v2-rows-x{i}-{short}", dtype=dtype)  # (B, T, C)
        pads = _pads(o, f"v2-rows-pads{i}-{short}", b, t)
        positions, key_mask = _frame(pads, 0, t)  # (B, T), (B, T)
        drawn = o.randint(cfg.T, b, t, tag=f"v2-rows-pos{i}-{short}")  # (B, T) anywhere
        keys = o.randint(2, b, t, tag=f"v2-rows-keys{i}-{short}").bool()  # (B, T)
        keys[0, : r.randint(1, t)] = False  # row 0's first queries see no key
        about = f"B={b} T={t} cfg.T={cfg.T} {short} pads={pads.tolist()}"
        name = f"v2/{short}/rows{i}"
        _one_call(o, attn, f"{name}/frame", f"{about} positions+key_mask", x=x,
                  positions=positions, key_mask=key_mask)  # fmt: skip
        _one_call(o, attn, f"{name}/drawn-positions", f"{about} drawn positions", x=x,
                  positions=drawn)  # fmt: skip
        _one_call(o, attn, f"{name}/drawn-keys", f"{about} drawn key mask", x=x, key_mask=keys)


def _cached(o: Oracle, dtype: torch.dtype, short: str, padded: bool) -> None:
    """A context fed in drawn chunks through a KVCache, then once uncached."""
    kind = "padded" if padded else "plain"
    r = o.rng(f"v2/{short}/{kind}")
    long = short == "f64" and not padded
    cfg = ModelConfig(V=2, T=1024 if long else r.choice((160, 300)), C=16, H=2, dropout=0.0)
    attn = _module(o, cfg, f"v2-{kind}-w-{short}", dtype)
    b = r.randint(1, 3)
    x = o.randn(b, cfg.T, cfg.C, tag=f"v2-{kind}-x-{short}", dtype=dtype)  # (B, T, C)
    pads = _pads(o, f"v2-{kind}-pads-{short}", b, r.randint(2, 40))  # pads of the prompt
    name, about = f"v2/{short}/{kind}", f"B={b} cfg.T={cfg.T} {short} {kind}"
    spans: list[tuple[int, int]] = []
    attn.kv_cache = KVCache(b, cfg.H, cfg.T, cfg.C // cfg.H, dtype=dtype, device=x.device)
    p = 0
    while p < cfg.T:
        n = min(cfg.T - p, r.choice((1, 1, 2, 3, 7, 16, 33, 64, r.randint(65, 200))))
        kw: dict[str, Any] = {"x": x[:, p : p + n]}
        if padded:
            kw["positions"], kw["key_mask"] = _frame(pads, p, p + n)
        _one_call(o, attn, f"{name}/p={p}/n={n}", f"{about}: {n} tokens after {p}", **kw)
        spans.append((p, n))
        p += n
    attn.kv_cache = None
    whole: dict[str, Any] = {}
    if padded:
        whole["positions"], whole["key_mask"] = _frame(pads, 0, cfg.T)
    key = _y(b * cfg.H * cfg.T * cfg.T)
    same = [
        o.equal((f"{name}/p={p}/n={n}", _y(b * cfg.H * n * (p + n)), ()),
                (f"{name}/whole", key, ((1, p, p + n),)))
        for p, n in spans
    ]  # fmt: skip
    with torch.no_grad():
        o.call(
            f"{name}/whole",
            partial(attn, x, return_attn=key == "0", **whole),
            desc=f"{about}: all {cfg.T} uncached",
            stages=4,
            reduction=max(cfg.C, cfg.T),
            rules=RULES,
            relations=same,
        )


def _bad(o: Oracle) -> None:
    cfg = ModelConfig(V=2, T=16, C=16, H=2)
    attn = _module(o, cfg, "v2-bad-w", torch.float32)
    x = torch.zeros(2, 4, 16)  # (2, 4, C)
    cases: dict[str, tuple[KVCache | None, dict[str, Any]]] = {
        "positions-dtype": (None, {"positions": torch.zeros(2, 4)}),
        "positions-shape": (None, {"positions": torch.zeros(2, 5, dtype=torch.int64)}),
        "positions-range": (None, {"positions": torch.full((2, 4), 16, dtype=torch.int64)}),
        "key-mask-dtype": (None, {"key_mask": torch.ones(2, 4, dtype=torch.int64)}),
        "key-mask-shape": (None, {"key_mask": torch.ones(2, 3, dtype=torch.bool)}),
        "cache-batch": (KVCache(3, 2, 16, 8, dtype=torch.float32, device=x.device), {}),
        "cache-dtype": (KVCache(2, 2, 16, 8, dtype=torch.float64, device=x.device), {}),
        "cache-short": (KVCache(2, 2, 3, 8, dtype=torch.float32, device=x.device), {}),
    }
    for what, (cache, kw) in cases.items():
        attn.kv_cache = cache
        o.call(f"v2/bad/{what}", partial(attn, x, **kw), desc=f"bad call: {what}", stages=1,
               reduction=1)  # fmt: skip
    attn.kv_cache = None


def calls(o: Oracle) -> None:
    """Every ``v2/`` call of the attention stage's oracle."""
    for dtype, short in ((torch.float64, "f64"), (torch.float32, "f32")):
        _rows(o, dtype, short)
        _cached(o, dtype, short, padded=False)
        _cached(o, dtype, short, padded=True)
    _bad(o)
