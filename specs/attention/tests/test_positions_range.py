"""Attention 3.3: a call whose positions are all in range but one is refused.

The range cases of ``test_positions_mask_cache`` move every position at
once (``pos + cfg.T``, ``pos - 1``), so a check that reads one end of the
range only, or part of the batch only, refuses them all the same. Here every
position is in ``[0, cfg.T)`` but one, at a drawn row and column, which is
``cfg.T + k`` or ``-1 - k``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache

Call = tuple[ModelConfig, torch.Tensor, tuple[int, int]]


@st.composite
def _calls(draw: st.DrawFn) -> Call:
    """A config with drawn heads, width, context and theta; ``(B, S)`` positions in
    ``[0, cfg.T)``; and the ``(row, column)`` of the one to put out of range."""
    H = draw(st.integers(1, 3))
    theta = draw(st.sampled_from([10000.0, 30.0, 700.0]))
    T, width = draw(st.integers(2, 10)), 2 * H * draw(st.integers(1, 3))
    cfg = ModelConfig(V=8, T=T, C=width, H=H, d_ff=8, dropout=0.0, rope_theta=theta)
    B, S = draw(st.integers(1, 3)), draw(st.integers(1, T))
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**31 - 1)))
    positions = torch.randint(0, T, (B, S), generator=gen)  # (B, S), every one in range
    return cfg, positions, (draw(st.integers(0, B - 1)), draw(st.integers(0, S - 1)))


@pytest.mark.invariant("attention.call_checked")
@given(call=_calls(), past=st.integers(0, 50), high=st.booleans(), cached=st.booleans())
@settings(max_examples=25)
def test_one_position_out_of_range_is_refused(
    device: torch.device, call: Call, past: int, high: bool, cached: bool
) -> None:
    """The call raises InputError naming the positions, with or without a cache, and
    writes nothing into the cache."""
    cfg, drawn, (b, i) = call
    positions = drawn.clone()  # (B, S)
    positions[b, i] = cfg.T + past if high else -1 - past
    B, S = positions.shape
    torch.manual_seed(0)
    attn = CausalSelfAttention(cfg).to(device).eval()
    x = torch.randn(B, S, cfg.C).to(device)  # (B, S, C)
    cache = KVCache(B, cfg.H, cfg.T, cfg.C // cfg.H, dtype=torch.float32, device=device)
    if cached:
        attn.kv_cache = cache
    with pytest.raises(InputError, match="positions"):
        attn(x, positions=positions.to(device))
    assert len(cache) == 0 and not cache.keys.any() and not cache.values.any()
