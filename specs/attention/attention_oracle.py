"""The attention stage's oracle driver (maintainer-owned; run by ``contracts pr``).

Called as ``calls(o)`` in an oracle worker, a plain Python process that
imported the stages the way a user does. Every input and weight is drawn
from the verdict's secret seed; every call goes through ``o.call``, whose
answers the checker compares with the same call on the base's code (or on
``attention_reference.py``). Domain covered:

- every length ``T`` from 1 to ``cfg.T = 1024`` in float64 (so every
  query-block edge: 127/128/129, 255/256/257, 511/512/513, ...), and in
  float32 the edges and 64 lengths drawn from the seed;
- configs drawn over widths, heads, ``rope_theta`` and dropout, the
  default config among them; batch sizes 1 to 4; eval and train; with and
  without probabilities; ``no_grad``, ``inference_mode`` and backward;
  float32, float64, bfloat16 autocast and a bfloat16 module;
- invariants where no second implementation can stand in (train mode with
  dropout): changing later tokens (by a factor of 1000) leaves earlier
  outputs unchanged, rows of a batch are independent, probabilities put no
  weight above the diagonal;
- bad inputs (wrong width, rank, length, dtype): the error type must match;
- the calls attention 1.1 added (``attention_oracle_v2.py``, named ``v2/``,
  judged against the float64 reference): positions, key masks, a KV cache.

Calls fall under the ``no-sdpa-runtime`` rule (their ATen ops are recorded
and judged): every one but seven in eight of the float64 sweep.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import attention_oracle_domain
import attention_oracle_v2
import torch
from speckit.module_calls import Sized

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

RULES = ("no-sdpa-runtime",)
BF16 = torch.bfloat16
PROBS = 1 << 19  # most (B, H, T, T) probabilities one call returns: 4 MB in float64
EDGES = (
    1,
    2,
    127,
    128,
    129,
    255,
    256,
    257,
    383,
    384,
    385,
    511,
    512,
    513,
    767,
    768,
    769,
    1023,
    1024,
)
CAUSAL_PROBS = "causality: the probabilities put weight on later positions"
ROWS = "batch independence: row 0 changed when only rows 1.. changed"
WIDTHS = ((8, 2), (16, 2), (32, 4), (48, 6), (64, 4), (128, 8), (256, 8), (512, 8))


def _eq(
    o: Oracle, call: str, other: str, key: str, dim: int, hi: int, says: str = ""
) -> dict[str, Any]:
    """``call``'s and ``other``'s ``key`` agree on ``[0, hi)`` along ``dim``."""
    return o.equal((call, key, ((dim, 0, hi),)), (other, key, ((dim, 0, hi),)), says=says)


def _module(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype) -> CausalSelfAttention:
    attn = CausalSelfAttention(cfg).to(dtype)
    o.load_weights(attn, tag)
    return attn


def _forwards(o: Oracle, reduction: int) -> Sized:
    """``o`` sized for one forward of the module: four rounding stages deep (qkv, scores,
    probs @ v, proj), sums as long as ``reduction``, its ops judged by ``no-sdpa-runtime``."""
    return Sized(o, stages=4, reduction=reduction, rules=RULES)


def _sweep(o: Oracle) -> None:
    """Every T in [1, 1024] in float64; in float32 the edges and 64 drawn lengths (eval).

    The ops of the float32 calls and of every 8th float64 one are recorded.
    """
    cfg = ModelConfig(V=2, T=1024, C=4, H=1, dropout=0.0, rope_theta=10000.0)
    r = o.rng("sweep")
    f32 = sorted({*EDGES, *(r.randint(1, cfg.T) for _ in range(64))})
    for dtype, short, lengths in (
        (torch.float64, "f64", range(1, cfg.T + 1)),
        (torch.float32, "f32", f32),
    ):
        attn = _module(o, cfg, f"sweep-{short}", dtype).eval()
        x_all = o.randn(1, cfg.T, cfg.C, tag=f"sweep-x-{short}", dtype=dtype)  # (1, T, C)
        for t in lengths:
            x = x_all[:, :t]  # (1, t, C)
            watched = short == "f32" or t % 8 == 0 or t in EDGES
            desc = f"B=1 T={t} C=4 H=1 {short} eval no_grad"
            rules, forward = RULES if watched else (), _forwards(o, max(cfg.C, t))
            with torch.no_grad():
                forward.call(f"sweep/{short}/T={t}", partial(attn, x), desc=desc, rules=rules)


def _config(o: Oracle, i: int) -> tuple[ModelConfig, str]:
    """Config ``i``: 0 is the default model's attention; 1 has no dropout, 2 has some,
    3 is drawn whole. Sizes and the rest are drawn from the seed."""
    r = o.rng(f"config{i}")
    c, h = WIDTHS[-1] if i == 0 else r.choice(WIDTHS)
    t = 1024 if i == 0 else r.choice((8, 64, 160, 300, 600, 1024))
    dropout = {0: 0.1, 1: 0.0, 2: r.choice((0.1, 0.5))}.get(i, r.choice((0.0, 0.1, 0.5)))
    theta = 10000.0 if i == 0 else r.choice((10000.0, 500.0, 500000.0, r.uniform(2.0, 1e5)))
    cfg = ModelConfig(V=2, T=t, C=c, H=h, dropout=dropout, rope_theta=theta)
    return cfg, f"C={c} H={h} cfg.T={t} dropout={dropout} theta={theta:.6g}"


def _one_config(o: Oracle, i: int) -> None:
    """Eval, inference, train (with invariants) and backward calls of config ``i``."""
    cfg, about = _config(o, i)
    r = o.rng(f"config{i}/inputs")
    b = 1 if i == 0 else r.randint(2, 4) if i < 3 else r.randint(1, 4)
    t = cfg.T if i == 0 else r.choice([x for x in (*EDGES, r.randint(2, cfg.T)) if 2 <= x <= cfg.T])
    d = max(cfg.C, t)
    probs = b * cfg.H * t * t <= PROBS  # else outputs only (the answers stay small)
    for dtype, short in ((torch.float32, "f32"), (torch.float64, "f64"))[: 1 if i == 0 else 2]:
        name = f"config{i}/{short}"
        attn = _module(o, cfg, f"config{i}-w-{short}", dtype)
        x = o.randn(b, t, cfg.C, tag=f"config{i}-x", dtype=dtype)  # (B, T, C)
        desc = f"B={b} T={t} {about} {short}"
        attn.eval()
        forward = _forwards(o, d)
        causal = [o.upper_zero((f"{name}/eval", "1", ()), says=CAUSAL_PROBS)] if probs else ()
        run, said = partial(attn, x, return_attn=probs), f"{desc} eval{' probs' if probs else ''}"
        with torch.no_grad():
            forward.call(f"{name}/eval", run, desc=said, relations=causal)
        with torch.inference_mode():
            forward.call(f"{name}/inference", partial(attn, x), desc=f"{desc} inference_mode")
        if i == 0:
            continue
        _train(o, attn, x, name, desc, d, probs)


def _train(
    o: Oracle,
    attn: CausalSelfAttention,
    x: torch.Tensor,
    name: str,
    desc: str,
    d: int,
    probs: bool,
) -> None:
    """Train-mode calls: compared where dropout is off, invariants where it is on."""
    b, t, c = x.shape
    r = o.rng(f"{name}/train")
    attn.train()
    # With dropout on, only the pre-dropout probabilities are compared; an honest
    # implementation may draw its masks in another order, so y gets invariants.
    keys = None if attn.cfg.dropout == 0.0 else ("1",) if probs else ()
    y = "0" if probs else "out"
    forward, train = _forwards(o, d), f"{name}/train"
    forward.call(train, partial(attn, x, return_attn=probs), desc=f"{desc} train", compare=keys)
    if t > 1:
        cut = r.randint(1, t - 1)
        later = x.clone()  # (B, T, C)
        causal = (
            f"causality: outputs at positions 0..{cut - 1} changed when only tokens {cut}.. did"
        )
        later[:, cut:] = 1000.0 * o.randn(b, t - cut, c, tag=f"{name}-far", dtype=x.dtype)
        forward.call(
            f"{name}/train-future",
            partial(attn, later, return_attn=probs),
            desc=f"{desc} train, tokens {cut}.. replaced by x1000 draws",
            compare=(),  # x1000 inputs: outside the bound's unit scale; invariant only
            relations=[_eq(o, train, f"{name}/train-future", y, 1, cut, says=causal)],
        )
    if b > 1:
        rows = x.clone()  # (B, T, C)
        rows[1:] = o.randn(b - 1, t, c, tag=f"{name}-rows", dtype=x.dtype)
        same = [_eq(o, train, f"{name}/train-rows", y, 0, 1, says=ROWS)]
        run = partial(attn, rows, return_attn=probs)
        desc_rows = f"{desc} train, rows 1.. replaced"
        forward.call(f"{name}/train-rows", run, desc=desc_rows, compare=keys, relations=same)
    if attn.cfg.dropout == 0.0:
        o.call(
            f"{name}/backward",
            lambda: _backward(o, attn, x, name),
            desc=f"{desc} train backward",
            stages=8,
            reduction=max(d, b * t),
            rules=RULES,
        )


def _backward(o: Oracle, attn: CausalSelfAttention, x: torch.Tensor, name: str) -> dict[str, Any]:
    attn.zero_grad()
    x = x.clone().requires_grad_(True)  # (B, T, C)
    y, _ = attn(x, return_attn=True)  # (B, T, C)
    g = o.randn(*y.shape, tag=f"{name}-g", dtype=y.dtype)  # (B, T, C)
    (y * g).sum().backward()
    grads = {n: p.grad for n, p in attn.named_parameters()}
    return {"y": y.detach(), "dx": x.grad, **grads}


def _mixed(o: Oracle) -> None:
    """bfloat16 autocast and a bfloat16 module, against the base's (same dtype)."""
    cfg = ModelConfig(V=2, T=300, C=32, H=4, dropout=0.0)
    attn = _module(o, cfg, "mixed-w", torch.float32).eval()
    for t in (1, 129, 300):
        x = o.randn(2, t, cfg.C, tag=f"mixed-x{t}", dtype=torch.float32)  # (2, T, C)

        def autocast(x: torch.Tensor = x) -> Any:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                return attn(x, return_attn=True)

        desc = f"B=2 T={t} C=32 bf16 autocast eval"
        forward = _forwards(o, max(32, t))
        forward.call(f"mixed/autocast/T={t}", autocast, desc=desc, computes_in=BF16)
    half = _module(o, cfg, "mixed-w", torch.float32).to(torch.bfloat16).eval()
    x = o.randn(2, 257, cfg.C, tag="mixed-half", dtype=torch.bfloat16)  # (2, 257, C)
    forward, desc = _forwards(o, 257), "B=2 T=257 C=32 bfloat16 module eval"
    forward.call(
        "mixed/bf16-module", lambda: half(x, return_attn=True), desc=desc, computes_in=BF16
    )


def _bad_inputs(o: Oracle) -> None:
    cfg = ModelConfig(V=2, T=16, C=16, H=2)
    attn = _module(o, cfg, "bad-w", torch.float32).eval()
    cases = {
        "width": torch.zeros(1, 4, 8),
        "rank": torch.zeros(4, 16),
        "length": torch.zeros(1, 17, 16),
        "dtype": torch.zeros(1, 4, 16, dtype=torch.float64),
        "empty": torch.zeros(1, 0, 16),
    }
    for what, x in cases.items():
        desc = f"bad input: {what} {tuple(x.shape)} {x.dtype}"
        o.call(f"bad/{what}", partial(attn, x), desc=desc, stages=1, reduction=1)


def calls(o: Oracle) -> None:
    """Every call of the attention stage's oracle, its domain sweeps last."""
    _sweep(o)
    for i in range(4):
        _one_config(o, i)
    _mixed(o)
    _bad_inputs(o)
    attention_oracle_v2.calls(o)
    attention_oracle_domain.calls(o)
