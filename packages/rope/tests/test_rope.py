"""The RoPE tests the rope spec (seed 003) names, one function each."""

from __future__ import annotations

import pytest
import torch

from niels_gpt.model.rope import apply_rope, rope_cache


def _qk(device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 17, 64, generator=gen)  # (B, H, Tq, D)
    k = torch.randn(2, 4, 17, 64, generator=gen)  # (B, H, Tq, D)
    return q.to(device), k.to(device)


@pytest.mark.invariant("rope.cache_shape_defaults")
def test_rope_cache_shapes_and_defaults() -> None:
    sin, cos = rope_cache(T=256, D=64)
    for table in (sin, cos):
        assert table.shape == (1, 1, 256, 32)
        assert table.dtype == torch.float32
        assert table.device == torch.device("cpu")


def _check_preserved(device: str | torch.device) -> None:
    q, k = _qk(device)
    sin, cos = rope_cache(T=256, D=64, device=device)
    q_rot, k_rot = apply_rope(q, k, sin, cos)
    for before, after in ((q, q_rot), (k, k_rot)):
        assert after.shape == before.shape
        assert after.dtype == before.dtype
        assert after.device == before.device
        assert torch.isfinite(after).all()


@pytest.mark.invariant("rope.preserves_shape_dtype_device")
def test_apply_rope_preserves_shape_dtype_device_cpu() -> None:
    _check_preserved("cpu")


@pytest.mark.invariant("rope.pair_norm_preserved")
def test_apply_rope_pairwise_norm_preserved_cpu() -> None:
    q, k = _qk()
    sin, cos = rope_cache(T=256, D=64)
    q_rot, k_rot = apply_rope(q, k, sin, cos)
    for before, after in ((q, q_rot), (k, k_rot)):
        pairs_before = before.reshape(*before.shape[:-1], 32, 2)  # (B, H, Tq, D/2, 2)
        pairs_after = after.reshape(*after.shape[:-1], 32, 2)  # (B, H, Tq, D/2, 2)
        norm_before = pairs_before.pow(2).sum(-1).sqrt()  # (B, H, Tq, D/2)
        norm_after = pairs_after.pow(2).sum(-1).sqrt()  # (B, H, Tq, D/2)
        torch.testing.assert_close(norm_before, norm_after, rtol=1e-5, atol=1e-5)


@pytest.mark.invariant("rope.cache_slicing")
@pytest.mark.parametrize("tq", [1, 17, 256])
def test_apply_rope_cache_slicing(tq: int) -> None:
    sin, cos = rope_cache(T=256, D=64)
    q = torch.randn(2, 4, tq, 64)  # (B, H, Tq, D)
    k = torch.randn(2, 4, tq, 64)  # (B, H, Tq, D)
    q_rot, k_rot = apply_rope(q, k, sin, cos)
    assert q_rot.shape == (2, 4, tq, 64)
    assert k_rot.shape == (2, 4, tq, 64)


@pytest.mark.invariant("rope.rejects_bad_input")
def test_rope_requires_even_D() -> None:
    with pytest.raises((AssertionError, ValueError), match="even"):
        rope_cache(T=8, D=63)
    sin, cos = rope_cache(T=8, D=62)
    odd = torch.randn(1, 2, 8, 63)  # (B, H, T, D) with D odd
    with pytest.raises((AssertionError, ValueError), match="even"):
        apply_rope(odd, odd, sin, cos)


@pytest.mark.invariant("rope.preserves_shape_dtype_device")
@pytest.mark.skipif(
    not (torch.backends.mps.is_available() and torch.backends.mps.is_built()),
    reason="MPS is not available on this machine (seed 003 makes this test optional)",
)
def test_apply_rope_mps_optional() -> None:
    _check_preserved("mps")
