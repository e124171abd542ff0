"""The block stage's oracle driver (maintainer-owned; run by ``contracts pr``).

``calls(o)`` drives ``Block`` and ``MLP`` of ``niels_gpt.model.block_v0``
with weights and inputs drawn from the verdict's secret seed: configs over
widths, heads, MLP widths, ``rope_theta`` and dropout (the default config
among them), lengths at every query-block edge up to 1024 and drawn ones,
batches of 1 to 3, eval (with probabilities), ``inference_mode``, train and
backward, float32, float64 and bfloat16 autocast. In training with dropout
the outputs get invariants instead of a comparison (later tokens x1000 leave
earlier outputs unchanged; rows are independent). Bad inputs must raise the
base's exception type. Block calls fall under ``no-sdpa-runtime``.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import block_oracle_domain
import torch
from speckit.module_calls import Sized

from niels_gpt.config import ModelConfig
from niels_gpt.model.block_v0 import MLP, Block

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

RULES = ("no-sdpa-runtime",)
EDGES = (1, 2, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1024)
WIDTHS = ((8, 2), (16, 2), (32, 4), (64, 8), (512, 8))
STAGES = 7  # ln1, qkv, scores, probs @ v, proj, fc, proj (+ residual adds, one rounding each)


def _config(o: Oracle, i: int) -> tuple[ModelConfig, str]:
    r = o.rng(f"config{i}")
    c, h = WIDTHS[-1] if i == 0 else r.choice(WIDTHS[:-1])
    t = 1024 if i == 0 else r.choice((8, 130, 300, 600, 1024))
    dropout = {0: 0.1, 1: 0.0, 2: 0.2}.get(i, r.choice((0.0, 0.2)))
    d_ff = 1536 if i == 0 else r.choice((c, 4 * c, 3 * c + 2))
    theta = 10000.0 if i == 0 else r.choice((10000.0, 500.0, r.uniform(2.0, 1e5)))
    cfg = ModelConfig(V=2, T=t, C=c, H=h, d_ff=d_ff, dropout=dropout, rope_theta=theta)
    return cfg, f"C={c} H={h} d_ff={d_ff} cfg.T={t} dropout={dropout} theta={theta:.6g}"


def _backward(o: Oracle, block: Block, x: torch.Tensor, tag: str) -> dict[str, Any]:
    block.zero_grad()
    x = x.clone().requires_grad_(True)  # (B, T, C)
    y = block(x)  # (B, T, C)
    (y * o.randn(*y.shape, tag=tag, dtype=y.dtype)).sum().backward()
    return {"y": y.detach(), "dx": x.grad, **{n: p.grad for n, p in block.named_parameters()}}


def _forwards(o: Oracle, reduction: int) -> Sized:
    """``o`` sized for one forward of a block: ``STAGES`` rounding stages deep, sums as long
    as ``reduction``, its ops judged by ``no-sdpa-runtime``."""
    return Sized(o, stages=STAGES, reduction=reduction, rules=RULES)


def _one(o: Oracle, i: int) -> None:
    cfg, about = _config(o, i)
    r = o.rng(f"config{i}/inputs")
    b = 1 if i == 0 else r.randint(2, 3) if i < 3 else r.randint(1, 3)
    t = cfg.T if i == 0 else r.choice([x for x in (*EDGES, r.randint(1, cfg.T)) if x <= cfg.T])
    d = max(cfg.C, cfg.d_ff, t)
    probs = b * cfg.H * t * t <= 1 << 19  # else outputs only: answers stay small
    y = "0" if probs else "out"
    dtypes = (
        ((torch.float32, "f32"),) if i == 0 else ((torch.float32, "f32"), (torch.float64, "f64"))
    )
    for dtype, short in dtypes:
        name, desc = f"config{i}/{short}", f"B={b} T={t} {about} {short}"
        block = Block(cfg).to(dtype)
        o.load_weights(block, f"{name}-w")
        x = o.randn(b, t, cfg.C, tag=f"config{i}-x", dtype=dtype)  # (B, T, C)
        block.eval()
        forward = _forwards(o, d)
        with torch.no_grad():
            forward.call(f"{name}/eval", partial(block, x, return_attn=probs), desc=f"{desc} eval")
        with torch.inference_mode():
            forward.call(f"{name}/inference", partial(block, x), desc=f"{desc} inference_mode")
        if i == 0:
            continue
        block.train()
        keys = None if cfg.dropout == 0.0 else ("1",) if probs else ()
        run = partial(block, x, return_attn=probs)
        forward.call(f"{name}/train", run, desc=f"{desc} train", compare=keys)
        if t > 1:
            cut = r.randint(1, t - 1)
            later = x.clone()  # (B, T, C)
            later[:, cut:] = 1000.0 * o.randn(b, t - cut, cfg.C, tag=f"{name}-far", dtype=dtype)
            same = o.equal(
                (f"{name}/train", y, ((1, 0, cut),)),
                (f"{name}/train-future", y, ((1, 0, cut),)),
            )
            forward.call(
                f"{name}/train-future",
                partial(block, later, return_attn=probs),
                desc=f"{desc} train, tokens {cut}.. x1000",
                compare=(),  # x1000 inputs: outside the bound's unit scale; invariant only
                relations=[same],
            )
        if cfg.dropout == 0.0:
            o.call(
                f"{name}/backward",
                partial(_backward, o, block, x, f"{name}-g"),
                desc=f"{desc} backward",
                stages=2 * STAGES,
                reduction=max(d, b * t),
                rules=RULES,
            )


def _mixed_and_mlp(o: Oracle) -> None:
    cfg = ModelConfig(V=2, T=300, C=32, H=4, d_ff=64, dropout=0.0)
    block = Block(cfg).eval()
    o.load_weights(block, "mixed-w")
    x = o.randn(2, 257, 32, tag="mixed-x", dtype=torch.float32)  # (2, 257, 32)

    def autocast() -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return block(x, return_attn=True)

    desc = "B=2 T=257 C=32 bf16 autocast eval"
    _forwards(o, 257).call("mixed/autocast", autocast, desc=desc, computes_in=torch.bfloat16)
    mlp = MLP(cfg)
    o.load_weights(mlp, "mlp-w")
    o.call("mlp", partial(mlp, x), desc="MLP on (2, 257, 32) float32", stages=2, reduction=64)
    bad = {"width": torch.zeros(1, 3, 8), "dtype": torch.zeros(1, 3, 32, dtype=torch.float64)}
    for what, z in bad.items():
        o.call(
            f"bad/block-{what}", partial(block, z), desc=f"bad input {what}", stages=1, reduction=1
        )
        o.call(f"bad/mlp-{what}", partial(mlp, z), desc=f"bad input {what}", stages=1, reduction=1)


def calls(o: Oracle) -> None:
    """Every call of the block stage's oracle, its domain sweeps last."""
    for i in range(4):
        _one(o, i)
    _mixed_and_mlp(o)
    block_oracle_domain.calls(o)
