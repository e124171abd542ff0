"""The attention tests the attention spec (seed 000) names."""

from __future__ import annotations

import pytest
import torch

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention


def _cfg() -> ModelConfig:
    return ModelConfig(V=64, T=8, C=32, H=4, d_ff=128, dropout=0.1)  # D = 8


@pytest.mark.invariant("attention.shape_dtype_device")
@pytest.mark.invariant("attention.rope_called_once")
def test_attention_shape_dtype_device_and_rope_called(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = _cfg()
    attn = CausalSelfAttention(cfg).to(device)
    x = torch.randn(2, cfg.T, cfg.C, device=device)  # (B, T, C)
    B, H, D = 2, cfg.H, cfg.C // cfg.H
    real_apply_rope = rope.apply_rope
    calls = []

    def counting_apply_rope(
        q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        assert q.shape == (B, H, cfg.T, D)
        assert k.shape == (B, H, cfg.T, D)
        calls.append(1)
        return real_apply_rope(q, k, sin, cos)

    monkeypatch.setattr("niels_gpt.model.rope.apply_rope", counting_apply_rope)
    y = attn(x)
    assert isinstance(y, torch.Tensor)
    assert y.shape == (2, cfg.T, cfg.C)
    assert y.dtype == x.dtype
    assert y.device == x.device
    assert len(calls) == 1
    attn(x, return_attn=True)
    assert len(calls) == 2


@pytest.mark.invariant("attention.causal_probs")
def test_causal_mask_zero_mass_above_diagonal(device: torch.device) -> None:
    cfg = _cfg()
    attn = CausalSelfAttention(cfg).to(device).eval()
    x = torch.randn(2, cfg.T, cfg.C, device=device)  # (B, T, C)
    y, a = attn(x, return_attn=True)
    assert y.shape == (2, cfg.T, cfg.C)
    assert a.shape == (2, cfg.H, cfg.T, cfg.T)
    upper = torch.triu(torch.ones(cfg.T, cfg.T, dtype=torch.bool, device=device), diagonal=1)
    assert a[..., upper].max().item() <= 1e-6
    torch.testing.assert_close(a.sum(dim=-1), torch.ones_like(a.sum(dim=-1)), rtol=0, atol=1e-5)
