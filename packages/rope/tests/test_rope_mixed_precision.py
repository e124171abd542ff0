"""RoPE under ``torch.autocast`` on the session's device: autocast changes nothing.

``apply_rope`` is elementwise arithmetic, which autocast leaves alone; the
dtype decisions belong to its callers (see ``niels_gpt.model.attention``). So
under every autocast dtype the device runs, the rotation is bit for bit the
one outside autocast, in each dtype the tables and q share, and a table of
another dtype than q is still rejected rather than cast.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.model.rope import apply_rope, rope_cache


@pytest.mark.invariant("rope.autocast_neutral")
@given(
    B=st.integers(1, 2),
    H=st.integers(1, 3),
    T=st.integers(1, 16),
    half=st.integers(1, 8),
    extra=st.integers(0, 4),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_autocast_changes_nothing_in_apply_rope(
    device: torch.device,
    autocast_dtypes: tuple[torch.dtype, ...],
    B: int,
    H: int,
    T: int,
    half: int,
    extra: int,
    seed: int,
    data: st.DataObject,
) -> None:
    autocast_dtype = data.draw(st.sampled_from(autocast_dtypes))
    dtype = data.draw(st.sampled_from([torch.float32, autocast_dtype]))
    D = 2 * half
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, D, generator=gen).to(device, dtype)  # (B, H, T, D)
    k = torch.randn(B, H, T, D, generator=gen).to(device, dtype)  # (B, H, T, D)
    sin, cos = rope_cache(T + extra, D, device=device, dtype=dtype)  # (1, 1, T + extra, D/2)
    plain = apply_rope(q, k, sin, cos)
    with torch.autocast(device.type, dtype=autocast_dtype):
        under = apply_rope(q, k, sin, cos)
    for a, b in zip(under, plain, strict=True):
        assert a.dtype == dtype
        assert torch.equal(a, b)


@pytest.mark.invariant("rope.autocast_neutral")
def test_autocast_does_not_excuse_mismatched_tables(
    device: torch.device, autocast_dtypes: tuple[torch.dtype, ...]
) -> None:
    """The failure the attention module used to hit: 16-bit q, float32 tables."""
    sin, cos = rope_cache(8, 4, device=device)  # float32
    for dtype in autocast_dtypes:
        q = torch.randn(1, 2, 8, 4, device=device).to(dtype)  # (B, H, T, D)
        with torch.autocast(device.type, dtype=dtype), pytest.raises(AssertionError) as info:
            apply_rope(q, q, sin, cos)
        assert "sin.dtype must equal q.dtype" in str(info.value)
        assert str(dtype) in str(info.value) and "got torch.float32" in str(info.value)
