"""The padding stage's oracle driver (maintainer-owned; run by ``contracts pr``).

``calls(o)`` drives the stage's public API with weights, ids, pad counts and
knobs drawn from the verdict's secret seed:

- ``padded_forward`` on left-padded batches with a random number of pads a
  row (none, some, all but one, a whole row of pads), at lengths up to 1024,
  in eval and train, float32 and float64, explicit and fast-path models,
  with and without a trace; each answer is compared with the base's, and
  each row's real logits with the same row run alone (an invariant), and the
  padded positions' logits must be exactly 0;
- ``padded_cross_entropy`` with and without a mask, forward and backward;
- ``generate`` in float64 from padded prompts (greedy, sampled with one
  generator or a generator a row, eos, traces): the ids must be equal;
- ``apply_rope_rows`` at drawn per-row positions;
- bad arguments, whose exception type must match the base's;
- stacked (1.1 of this driver, spec 3.4): padded ``generate`` on explicit and
  fast-path models, float32 and float64, greedy and sampled with a generator a
  row, decoding through every cache length 2..43 and 290..319; besides the
  base's answers, the fast model's ids must equal the explicit model's, and
  each row's tokens those of its real prompt generated alone (invariants).

Size (12.0 of the spec): ``apply_rope_rows`` in float32 on two left-padded
rows of GPT-2 small's H = 12 heads, T = 1024, D = 64, and ``padded_cross_entropy``
with its gradient on two rows of 8 float32 logits over its vocabulary
(V = 50257); each once more at sizes drawn wide by the secret seed
(``speckit.sizes``).

Padded forwards fall under ``no-sdpa-runtime``, padded generation under
``no-sdpa-in-generate`` and ``no-cat-in-generate`` (batches with a pad: a
fast-path model runs its own forward on a batch without one).
"""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

import padding_oracle_domain
import torch
from speckit import model_sweeps as sweeps
from speckit import sizes

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import (
    apply_rope_rows,
    generate,
    padded_cross_entropy,
    padded_forward,
)

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

COMBOS = ("combos",)  # spec axes these calls sweep (checks/evidence/coverage reads the literals)
ERRORS = ("errors",)


def _gpt(o: Oracle, cfg: ModelConfig, tag: str, dtype: torch.dtype, fast: bool) -> GPT:
    gpt = GPT(cfg).to(dtype).eval()
    o.load_weights(gpt, tag)
    if fast:
        use_fast_attention(gpt)
    return gpt


def _pads(o: Oracle, tag: str, b: int, t: int) -> list[int]:
    """Leading pads a row: the first row many (a third to all but one), the second none,
    the rest drawn (none, one, all but one, any, or a row of pads only)."""
    r = o.rng(tag)
    pads = [r.randint(t // 3, t - 1), 0]
    pads += [r.choice((0, 1, t - 1, r.randint(0, t - 1), t)) for _ in range(b - 2)]
    return pads[:b]


def _mask(pads: list[int], t: int) -> torch.Tensor:
    cols = torch.arange(t)  # (t,)
    return cols[None, :] >= torch.tensor(pads)[:, None]  # (B, t) bool, left-padded


def _forward(o: Oracle, i: int) -> None:
    r = o.rng(f"forward{i}")
    cfg = ModelConfig(
        V=r.choice((40, 300)),
        T=1024 if i == 0 else r.choice((64, 300)),
        C=16,
        H=2,
        L=2,
        d_ff=32,
        dropout=0.2 if i in (3, 5) else 0.0,
    )
    dtype = torch.float64 if i % 2 else torch.float32
    fast = i % 3 == 2
    gpt = _gpt(o, cfg, f"forward{i}-w", dtype, fast)
    b = r.randint(2, 4)
    t = cfg.T if i == 0 else r.randint(2, cfg.T)
    pads = _pads(o, f"forward{i}-pads", b, t)
    ids = o.randint(cfg.V, b, t, tag=f"forward{i}-ids")  # (B, t)
    mask = _mask(pads, t)  # (B, t)
    name = f"forward{i}"
    about = f"V={cfg.V} cfg.T={cfg.T} {dtype} fast={fast} B={b} t={t} pads={pads}"
    # A trace returns the full (B, H, t, t) matrix: only while it stays small.
    trace = r.choice((None, 0, 1)) if b * cfg.H * t * t <= 1 << 19 else None
    stages, d = 16, max(cfg.C, t, cfg.V)
    # Without a pad a fast-path model runs its own forward (SDPA): watched only with pads.
    rules = ("no-sdpa-runtime",) if any(pads) else ()
    key = "out" if trace is None else "0"
    alone = [o.zero((name, key, ((0, row, row + 1), (1, 0, p)))) for row, p in enumerate(pads)]
    with torch.no_grad():
        for row, p in enumerate(pads):
            if p < t:  # a row with a real token, run alone: its logits are the padded row's
                single = f"{name}/row{row}"
                o.call(
                    single,
                    partial(padded_forward, gpt, ids[row : row + 1, p:], None),
                    desc=f"{about}: row {row} alone",
                    stages=stages,
                    reduction=d,
                )
                alone.append(
                    o.equal((name, key, ((0, row, row + 1), (1, p, t))), (single, "out", ()))
                )
        o.call(
            name,
            partial(padded_forward, gpt, ids, mask, trace_layer=trace),
            desc=f"{about} eval trace_layer={trace}",
            stages=stages,
            reduction=d,
            rules=rules,
            relations=alone,
        )
    if cfg.dropout > 0.0:  # in training, later ids redrawn leave the earlier logits alone
        gpt.train()
        judged = partial(o.call, stages=stages, reduction=d, rules=rules, compare=())
        judged(f"{name}/train", partial(padded_forward, gpt, ids, mask), desc=f"{about} train")
        later = ids.clone()  # (B, t)
        cut = r.randint(1, t) if t > 1 else 1
        later[:, cut:] = o.randint(cfg.V, b, t - cut, tag=f"{name}-later")
        before = ((1, 0, cut),)  # the logits before the cut
        same = o.equal((f"{name}/train", "out", before), (f"{name}/train-future", "out", before))
        judged(f"{name}/train-future", partial(padded_forward, gpt, later, mask),
               desc=f"{about} train, ids {cut}.. redrawn", relations=[same])  # fmt: skip


def _loss(o: Oracle) -> None:
    cfg = ModelConfig(V=30, T=64, C=16, H=2, L=1, d_ff=32, dropout=0.0)
    gpt = _gpt(o, cfg, "loss-w", torch.float32, False)
    ids = o.randint(30, 3, 40, tag="loss-ids")  # (3, 40)
    targets = o.randint(30, 3, 40, tag="loss-targets")  # (3, 40)
    mask = _mask(_pads(o, "loss-pads", 3, 40), 40)  # (3, 40)

    def backward(mask: torch.Tensor | None) -> dict[str, Any]:
        gpt.zero_grad()
        logits = padded_forward(gpt, ids, mask)  # (3, 40, 30)
        assert isinstance(logits, torch.Tensor)
        loss = padded_cross_entropy(logits, targets, mask)
        torch.autograd.backward(loss)
        return {"loss": loss.detach(), **{n: p.grad for n, p in gpt.named_parameters()}}

    for label, m in (("masked", mask), ("none", None)):
        o.call(
            f"loss/{label}",
            partial(backward, m),
            desc=f"padded loss backward, mask {label}",
            stages=12,
            reduction=120,
        )


def _generate(o: Oracle) -> None:
    r = o.rng("generate")
    for i in range(5):
        cfg = ModelConfig(V=r.choice((9, 80)), T=r.choice((48, 160)), C=16, H=2, L=2, d_ff=32)
        gpt = _gpt(o, cfg, f"gen{i}-w", torch.float64, fast=i == 3)
        b, t = r.randint(1, 3), r.randint(2, cfg.T // 2)
        pads = [min(p, t - 1) for p in _pads(o, f"gen{i}-pads", b, t)]
        prompt = o.randint(cfg.V, b, t, tag=f"gen{i}-prompt")  # (B, t)
        per_row = i % 2 == 1
        gens: Any = [o.generator(f"gen{i}-row{j}") for j in range(b)] if per_row else None
        knobs: dict[str, Any] = {
            "temperature": 0.0 if i == 0 else r.choice((1.0, 0.8)),
            "top_k": r.choice((None, 4)),
            "eos_id": r.choice((None, 1)),
            "generator": gens if per_row else o.generator(f"gen{i}-draws"),
            "trace_layer": r.choice((None, 0)),
        }
        new = r.randint(0, cfg.T - t)
        rules = ("no-sdpa-in-generate", "no-cat-in-generate") if any(pads) else ()
        run = partial(generate, gpt, prompt, _mask(pads, t), new, **knobs)
        desc = f"padded generate B={b} t={t} pads={pads} new={new} per_row={per_row}"
        sweeps.handed_back(o, f"generate/{i}", run, gpt, prompt, desc=desc, stages=16,
                           reduction=cfg.T, rules=rules)  # fmt: skip


def _rows_and_bad(o: Oracle) -> None:
    sin, cos = rope.rope_cache(300, 8, dtype=torch.float64)
    q = o.randn(3, 2, 17, 8, tag="rows-q")  # (3, 2, 17, 8) float64
    k = o.randn(3, 2, 17, 8, tag="rows-k")  # (3, 2, 17, 8) float64
    positions = o.randint(300, 3, 17, tag="rows-pos")  # (3, 17)
    o.call(
        "rope_rows",
        partial(apply_rope_rows, q, k, sin, cos, positions),
        desc="apply_rope_rows (3, 2, 17, 8) float64 at drawn positions",
        stages=2,
        reduction=2,
    )
    gpt = _gpt(o, ModelConfig(V=10, T=8, C=16, H=2, L=1, d_ff=16), "bad-w", torch.float32, False)
    ids = torch.zeros(2, 4, dtype=torch.int64)  # (2, 4)
    cases: dict[str, Any] = {
        "mask-dtype": partial(padded_forward, gpt, ids, torch.ones(2, 4, dtype=torch.int64)),
        "mask-shape": partial(padded_forward, gpt, ids, torch.ones(2, 5, dtype=torch.bool)),
        "right-padded": partial(padded_forward, gpt, ids, torch.tensor([[1, 1, 0, 0]] * 2).bool()),
        "empty-row-generate": partial(
            generate, gpt, ids, torch.tensor([[0] * 4, [1] * 4]).bool(), 1
        ),
        "positions": partial(apply_rope_rows, q, k, sin, cos, positions + 300),
    }
    for what, fn in cases.items():
        o.call(f"bad/{what}", fn, desc=f"bad argument: {what}", stages=1, reduction=1, axes=ERRORS)


COMBO_SPANS = ((3, 41, 48), (290, 30, 320))  # prompt width, new tokens, cfg.T


def _combos(o: Oracle) -> None:
    """Fast path x KV cache x key mask x positions x padding, through padded ``generate``."""
    for dtype, short in ((torch.float32, "f32"), (torch.float64, "f64")):
        for t, new, T in COMBO_SPANS:
            cfg = ModelConfig(V=23, T=T, C=16, H=2, L=1, d_ff=32, dropout=0.0)
            pads = [0, t - 1, t // 2]  # none, all but one, half
            prompt = o.randint(23, 3, t, tag=f"combos-{t}-prompt")  # (3, t)
            for sampled in (False, True):
                knobs: dict[str, Any] = {"temperature": 1.0 if sampled else 0.0}
                tag = f"combos/{short}/t={t}/{'sampled' if sampled else 'greedy'}"
                for fast in (False, True):
                    gpt = _gpt(o, cfg, f"combos-{short}-{T}-w", dtype, fast)
                    name = f"{tag}/{'fast' if fast else 'explicit'}"
                    gens = [o.generator(f"{tag}-row{j}") for j in range(3)]
                    exact = dtype == torch.float64  # ids agree where rounding cannot flip a draw
                    same = [o.equal((name, "out", ()), (f"{tag}/explicit", "out", ()))]
                    o.call(
                        name,
                        partial(
                            generate, gpt, prompt, _mask(pads, t), new, generator=gens, **knobs
                        ),
                        desc=f"padded generate {short} B=3 t={t} pads={pads} new={new} "
                        f"sampled={sampled} fast={fast}",
                        stages=16,
                        reduction=cfg.T,
                        relations=same if fast and exact else (),
                        axes=COMBOS,
                    )
                    if not exact:
                        continue
                    for row, pad in enumerate(pads):
                        alone = f"{name}/row{row}"
                        gen = [o.generator(f"{tag}-row{row}")]
                        real = prompt[row : row + 1, pad:]  # (1, t - pad)
                        cols = ((0, row, row + 1), (1, pad, t + new))
                        o.call(
                            alone,
                            partial(generate, gpt, real, None, new, generator=gen, **knobs),
                            desc=f"row {row} of {name} alone ({t - pad} prompt tokens)",
                            stages=16,
                            reduction=cfg.T,
                            relations=[o.equal((name, "out", cols), (alone, "out", ()))],
                            axes=COMBOS,
                        )


def _sized_loss(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> Any:
    """``padded_cross_entropy`` of ``logits`` ``(B, t, V)`` and its gradient in them."""
    z = logits.detach().requires_grad_(True)  # (B, t, V)
    loss = padded_cross_entropy(z, targets, mask)
    torch.autograd.backward(loss)
    return {"loss": loss.detach(), "grad": z.grad}


def _sizes(o: Oracle) -> None:
    """``size``: per-row rotations and the padded loss at each of ``sizes.real_sizes``."""
    for size in sizes.real_sizes(o, "size"):
        h, t, d, v, at = size.H, size.T, size.D, size.V, f"size/{size.name}"
        if o.wants(f"{at}/rope_rows"):
            sin, cos = rope.rope_cache(t, d)  # (1, 1, T, D/2) float32 each
            q = o.randn(2, h, t, d, tag=f"size-q-{size.name}", dtype=torch.float32)  # (2, H, T, D)
            k = o.randn(2, h, t, d, tag=f"size-k-{size.name}", dtype=torch.float32)  # (2, H, T, D)
            pads = _pads(o, f"size-pads-{size.name}", 2, t)
            cols = torch.arange(t)  # (T,)
            positions = (cols[None, :] - torch.tensor(pads)[:, None]).clamp(min=0)  # (2, T)
            o.call(
                f"{at}/rope_rows",
                partial(apply_rope_rows, q, k, sin, cos, positions),
                desc=f"apply_rope_rows (2, {h}, {t}, {d}) float32 pads={pads}, {size.name} sizes",
                stages=2,
                reduction=2,
                axes=("size",),
            )
        logits = 3.0 * o.randn(2, 8, v, tag=f"size-logits-{size.name}", dtype=torch.float32)
        targets = o.randint(v, 2, 8, tag=f"size-targets-{size.name}")  # (2, 8)
        pads = _pads(o, f"size-loss-pads-{size.name}", 2, 8)
        o.call(
            f"{at}/loss",
            partial(_sized_loss, logits, targets, _mask(pads, 8)),  # logits: (2, 8, V)
            desc=f"padded_cross_entropy (2, 8, {v}) float32 pads={pads}, backward, "
            f"{size.name} sizes",
            stages=4,
            reduction=v,
            axes=("size",),
        )


def calls(o: Oracle) -> None:
    """Every call of the padding stage's oracle, its domain sweeps last."""
    for i in range(6):
        _forward(o, i)
    _loss(o)
    _generate(o)
    _rows_and_bad(o)
    _combos(o)
    padding_oracle_domain.calls(o)
    _sizes(o)
