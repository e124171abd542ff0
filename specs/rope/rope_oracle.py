"""The rope stage's oracle driver (maintainer-owned; run by ``contracts pr``).

``calls(o)`` drives ``rope_cache`` and ``apply_rope`` with draws from the
verdict's secret seed: tables for lengths up to 4096, head dims 2 to 256 and
thetas from 2 to 1e6, in float64, float32, bfloat16 and float16; rotations
of contiguous and strided ``q``/``k`` (a transposed projection, as attention
hands them) against tables longer than the sequence; bad inputs, whose
exception type must match. The checker compares each answer with the
base's.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING

import rope_oracle_domain
import torch

import niels_gpt.model.rope as rope

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

DTYPES = (torch.float64, torch.float32, torch.bfloat16, torch.float16)
ROTATION_RULES = ("no-cast-in-apply-rope-runtime",)  # the rotations' ops are recorded


def _tables(o: Oracle) -> None:
    r = o.rng("tables")
    for i in range(12):
        t = r.choice((1, 2, 127, 128, 129, 1024, 4096, r.randint(1, 4096)))
        d = 2 * r.randint(1, 128)
        theta = r.choice((10000.0, 500000.0, r.uniform(2.0, 1e6)))
        dtype = r.choice(DTYPES)
        table = partial(rope.rope_cache, t, d, theta=theta, dtype=dtype)
        desc = f"rope_cache(T={t}, D={d}, theta={theta:.6g}, dtype={dtype})"
        o.call(f"cache/{i}", table, desc=desc, stages=1, reduction=1)


def _rotations(o: Oracle) -> None:
    r = o.rng("rotations")
    for i in range(16):
        b, h = r.randint(1, 3), r.randint(1, 4)
        t, d = r.choice((1, 5, 128, 129, 300, 1024)), 2 * r.randint(1, 32)
        extra = r.choice((0, 0, 7, 500))
        dtype = r.choice(DTYPES)
        strided = r.random() < 0.5
        sin, cos = rope.rope_cache(t + extra, d, theta=r.uniform(100.0, 1e5), dtype=dtype)
        if strided:  # (B, T, H, D) viewed as (B, H, T, D), as attention's projections are
            q = o.randn(b, t, h, d, tag=f"q{i}", dtype=dtype).transpose(1, 2)
            k = o.randn(b, t, h, d, tag=f"k{i}", dtype=dtype).transpose(1, 2)
        else:
            q = o.randn(b, h, t, d, tag=f"q{i}", dtype=dtype)  # (B, H, T, D)
            k = o.randn(b, h, t, d, tag=f"k{i}", dtype=dtype)  # (B, H, T, D)
        desc = f"apply_rope q,k {tuple(q.shape)} {dtype} strided={strided} Tcache={t + extra}"
        rotation = partial(rope.apply_rope, q, k, sin, cos)
        o.call(f"apply/{i}", rotation, desc=desc, stages=2, reduction=2, rules=ROTATION_RULES)


def _bad(o: Oracle) -> None:
    sin, cos = rope.rope_cache(8, 4)
    q = o.randn(1, 2, 8, 4, tag="bad-q", dtype=torch.float32)  # (1, 2, 8, 4)
    cases = {
        "odd-D": lambda: rope.rope_cache(8, 3),
        "T=0": lambda: rope.rope_cache(0, 4),
        "theta<0": lambda: rope.rope_cache(8, 4, theta=-1.0),
        "short-cache": lambda: rope.apply_rope(q, q, sin[:, :, :4], cos[:, :, :4]),
        "dtype": lambda: rope.apply_rope(q, q, sin.double(), cos.double()),
        "rank": lambda: rope.apply_rope(q[0], q[0], sin, cos),
    }
    for what, fn in cases.items():
        o.call(f"bad/{what}", fn, desc=f"bad input: {what}", stages=1, reduction=1)


def calls(o: Oracle) -> None:
    """Every call of the rope stage's oracle, its domain sweeps last."""
    _tables(o)
    _rotations(o)
    _bad(o)
    rope_oracle_domain.calls(o)
