"""Which RoPE table rows the padded paths use, seen by a spy on ``rope.apply_rope``.

RoPE scores depend on position differences only, so logits cannot tell a
row's positions from the same positions shifted: the spy can. A real token's
position counts the real tokens before it in its row; a pad's is 0; when
generating, column ``c`` of a row with ``P`` pads is at ``c - P``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import generate, padded_forward

Randomise = Callable[[torch.nn.Module, int], None]
Call = tuple[torch.Tensor, torch.Tensor]  # (q, sin) as the spy saw them


@contextmanager
def _spy() -> Iterator[list[Call]]:
    """Record ``(q, sin)`` of every ``rope.apply_rope`` call; the real one still runs."""
    real = rope.apply_rope
    calls: list[Call] = []

    def spy(
        q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append((q.detach().clone(), sin.detach().clone()))
        return real(q, k, sin, cos)

    rope.apply_rope = spy
    try:
        yield calls
    finally:
        rope.apply_rope = real


def _written_out(pads: list[int], t: int) -> torch.Tensor:
    """``(B*t,)`` positions, counted token by token: real j-th token at j, pads at 0."""
    out = []
    for p in pads:
        out += [0] * p + list(range(t - p))
    return torch.tensor(out)


@pytest.mark.invariant("padding.row_positions")
@settings(max_examples=10)
@given(
    B=st.integers(1, 4),
    t=st.integers(1, 8),
    fast=st.booleans(),
    traced=st.booleans(),
    seed=st.integers(0, 99),
    data=st.data(),
)
def test_padded_forward_uses_each_rows_own_table_rows(
    device: torch.device,
    randomise: Randomise,
    B: int,
    t: int,
    fast: bool,
    traced: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    cfg = ModelConfig(V=11, T=8, C=12, L=2, H=3, d_ff=6, dropout=0.0, rope_theta=21.0)
    pads = data.draw(
        st.lists(st.integers(0, t), min_size=B, max_size=B).filter(lambda p: max(p) > 0)
    )
    model = GPT(cfg)
    randomise(model, seed)
    model.to(device).eval()
    if fast:
        use_fast_attention(model)
    ids = torch.randint(0, cfg.V, (B, t), generator=torch.Generator().manual_seed(seed)).to(device)
    mask = (torch.arange(t)[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (B, t)
    with _spy() as calls, torch.no_grad():
        padded_forward(model, ids, mask, trace_layer=1 if traced else None)
    assert len(calls) == cfg.L  # one call a layer for the whole batch
    want = _written_out(pads, t).to(device)  # (B*t,)
    for (q, sin), block in zip(calls, model.blocks, strict=True):
        assert q.shape == (1, cfg.H, B * t, cfg.C // cfg.H)
        assert torch.equal(sin[0, 0], block.attn.rope_sin[0, 0][want])


@pytest.mark.invariant("padding.row_positions")
def test_decode_steps_rotate_at_column_minus_pads(
    device: torch.device, randomise: Randomise
) -> None:
    cfg = ModelConfig(V=15, T=12, C=8, L=3, H=2, d_ff=6, dropout=0.0)
    model = GPT(cfg)
    randomise(model, 1)
    model.to(device).eval()
    pads, t, new = [0, 2, 4], 5, 5
    ids = torch.randint(0, cfg.V, (3, t), generator=torch.Generator().manual_seed(2)).to(device)
    mask = (torch.arange(t)[None, :] >= torch.tensor(pads)[:, None]).to(device)  # (3, t)
    with _spy() as calls:
        generate(model, ids, mask, new, temperature=0.0, trace_layer=2)
    assert len(calls) == cfg.L * new
    table = model.blocks[0].attn.rope_sin[0, 0]  # (T, D/2)
    prefill = _written_out(pads, t).to(device)  # (3*t,)
    for i in range(new):
        col = t + i - 1
        want = prefill if i == 0 else torch.tensor([col - p for p in pads], device=device)
        for _, sin in calls[cfg.L * i : cfg.L * (i + 1)]:
            assert torch.equal(sin[0, 0], table[want]), f"step {i}"
