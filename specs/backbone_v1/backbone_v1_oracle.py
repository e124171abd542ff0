"""The backbone_v1 stage's oracle driver (maintainer-owned; run by ``contracts pr``).

``calls(o)`` drives ``GPT`` (``forward``, ``forward_with_attn_trace``) and the
blocks module (``Block``, ``MLP``, ``RMSNorm``) with weights, ids and
configs drawn from the verdict's secret seed: vocabularies, widths, depths,
dropout and ``rope_theta`` drawn, the default widths among them; lengths at
query-block edges up to 1024 and drawn ones; eval, ``inference_mode``, train
and backward through a cross-entropy loss; bfloat16 autocast; traces of
every layer with and without the full matrix. In training with dropout the
logits get invariants (later ids changed leave earlier logits unchanged;
rows are independent). Bad inputs must raise the base's exception type.
GPT calls fall under ``no-sdpa-runtime``.
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import backbone_v1_oracle_domain
import torch
import torch.nn.functional as F

from niels_gpt.config import ModelConfig
from niels_gpt.model.blocks import MLP, Block, RMSNorm
from niels_gpt.model.gpt import GPT

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

RULES = ("no-sdpa-runtime",)
EDGES = (1, 2, 127, 128, 129, 255, 256, 257, 511, 512, 513, 1024)


def _config(o: Oracle, i: int) -> tuple[ModelConfig, str]:
    r = o.rng(f"config{i}")
    if i == 0:  # the default widths, two layers, a quarter of the default context
        cfg = ModelConfig(V=256, T=256, L=2)
    else:
        c, h = r.choice(((16, 2), (32, 4), (64, 8), (48, 3)))
        cfg = ModelConfig(
            V=r.choice((2, 50, 1000)),
            T=r.choice((8, 200, 600, 1024)),
            C=c,
            H=h,
            L=r.randint(1, 3),
            d_ff=r.choice((c, 4 * c)),
            dropout={1: 0.0, 2: 0.3}.get(i, r.choice((0.0, 0.3))),
            rope_theta=r.choice((10000.0, 500.0, r.uniform(2.0, 1e5))),
        )
    about = (
        f"V={cfg.V} C={cfg.C} H={cfg.H} L={cfg.L} d_ff={cfg.d_ff} cfg.T={cfg.T} "
        f"dropout={cfg.dropout} theta={cfg.rope_theta:.6g}"
    )
    return cfg, about


def _loss(o: Oracle, gpt: GPT, ids: torch.Tensor, tag: str) -> dict[str, Any]:
    gpt.zero_grad()
    logits = gpt(ids)  # (B, T, V)
    targets = o.randint(gpt.cfg.V, *ids.shape, tag=tag)  # (B, T)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    torch.autograd.backward(loss)
    return {"loss": loss.detach(), **{n: p.grad for n, p in gpt.named_parameters()}}


def _one(o: Oracle, i: int) -> None:
    cfg, about = _config(o, i)
    r = o.rng(f"config{i}/inputs")
    b = 1 if i == 0 else r.randint(2, 3) if i < 3 else r.randint(1, 3)
    t = cfg.T if i == 0 else r.choice([x for x in (*EDGES, r.randint(1, cfg.T)) if x <= cfg.T])
    stages = 7 * cfg.L + 2
    d = max(cfg.C, cfg.d_ff, t)
    ids = o.randint(cfg.V, b, t, tag=f"config{i}-ids")  # (B, T)
    for dtype, short in ((torch.float32, "f32"), (torch.float64, "f64"))[: 1 if i == 0 else 2]:
        name, desc = f"config{i}/{short}", f"B={b} T={t} {about} {short}"
        gpt = GPT(cfg).to(dtype)
        o.load_weights(gpt, f"{name}-w")
        gpt.eval()
        layer = r.randrange(cfg.L)
        full = b * cfg.H * t * t <= 1 << 19  # the full matrix only while it stays small
        judged = partial(o.call, stages=stages, reduction=d, rules=RULES)
        with torch.no_grad():
            judged(f"{name}/eval", partial(gpt, ids), desc=f"{desc} eval")
            judged(
                f"{name}/trace",
                partial(gpt.forward_with_attn_trace, ids, layer, full),
                desc=f"{desc} trace layer {layer}{' full' if full else ''}",
                relations=[o.upper_zero((f"{name}/trace", "1.attn_full", ()))] if full else (),
            )
        with torch.inference_mode():
            judged(
                f"{name}/inference-trace",
                partial(gpt.forward_with_attn_trace, ids, layer),
                desc=f"{desc} inference_mode trace layer {layer}",
            )
        if i == 0:
            continue
        _train(o, gpt, ids, name, desc, stages, d)


def _train(
    o: Oracle, gpt: GPT, ids: torch.Tensor, name: str, desc: str, stages: int, d: int
) -> None:
    """``name/train``, and in training mode the invariants: ids redrawn from a cut on
    (``name/train-future``) leave the logits before it alone, rows redrawn from the second
    on (``name/train-rows``) leave the first row's alone; without dropout, a backward."""
    b, t = ids.shape
    r = o.rng(f"{name}/train")
    gpt.train()
    judged = partial(o.call, stages=stages, reduction=d, rules=RULES)
    keys: tuple[str, ...] | None = None if gpt.cfg.dropout == 0.0 else ()
    judged(f"{name}/train", partial(gpt, ids), desc=f"{desc} train", compare=keys)
    # (call, its ids, the logits left alone, what was redrawn)
    redrawn: list[tuple[str, torch.Tensor, tuple[tuple[int, int, int]], str]] = []
    if t > 1:
        cut = r.randint(1, t - 1)
        later = ids.clone()  # (B, T)
        later[:, cut:] = o.randint(gpt.cfg.V, b, t - cut, tag=f"{name}-later")
        redrawn.append(("train-future", later, ((1, 0, cut),), f"ids {cut}.."))
    if b > 1:
        rows = ids.clone()  # (B, T)
        rows[1:] = o.randint(gpt.cfg.V, b - 1, t, tag=f"{name}-rows")
        redrawn.append(("train-rows", rows, ((0, 0, 1),), "rows 1.."))
    for call, z, alone, what in redrawn:
        same = o.equal((f"{name}/train", "out", alone), (f"{name}/{call}", "out", alone))
        judged(f"{name}/{call}", partial(gpt, z), desc=f"{desc} train, {what} redrawn",
               compare=keys, relations=[same])  # fmt: skip
    if gpt.cfg.dropout == 0.0:
        o.call(
            f"{name}/backward",
            partial(_loss, o, gpt, ids, f"{name}-targets"),
            desc=f"{desc} cross-entropy backward",
            stages=2 * stages,
            reduction=max(d, b * t, gpt.cfg.V),
            rules=RULES,
        )


def _parts(o: Oracle) -> None:
    cfg = ModelConfig(V=64, T=300, C=32, H=4, L=2, d_ff=64, dropout=0.0)
    gpt = GPT(cfg).eval()
    o.load_weights(gpt, "parts-gpt")
    ids = o.randint(64, 2, 257, tag="parts-ids")  # (2, 257)

    def autocast() -> Any:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return gpt.forward_with_attn_trace(ids, 1, True)

    o.call(
        "mixed/autocast",
        autocast,
        desc="B=2 T=257 C=32 L=2 bf16 autocast trace",
        stages=16,
        reduction=257,
        rules=RULES,
        computes_in=torch.bfloat16,
    )
    x = o.randn(2, 257, 32, tag="parts-x", dtype=torch.float32)  # (2, 257, 32)
    for part, module in (("block", Block(cfg)), ("mlp", MLP(cfg)), ("rmsnorm", RMSNorm(32))):
        module.eval()
        o.load_weights(module, f"parts-{part}")
        o.call(
            f"parts/{part}",
            partial(module, x),
            desc=f"{part} on (2, 257, 32) float32",
            stages=7,
            reduction=257,
        )
    bad = {
        "id-range": torch.full((1, 4), 64),
        "id-dtype": torch.zeros(1, 4),
        "rank": torch.zeros(4, dtype=torch.int64),
        "length": torch.zeros(1, 301, dtype=torch.int64),
    }
    cases = {what: (partial(gpt, z), f"bad input {what}") for what, z in bad.items()}
    cases["trace-layer"] = (partial(gpt.forward_with_attn_trace, ids, 2), "trace_layer = L")
    for what, (fn, desc) in cases.items():
        o.call(f"bad/{what}", fn, desc=desc, stages=1, reduction=1)


def calls(o: Oracle) -> None:
    """Every call of the backbone_v1 stage's oracle, its domain sweeps last."""
    for i in range(4):
        _one(o, i)
    _parts(o)
    backbone_v1_oracle_domain.calls(o)
