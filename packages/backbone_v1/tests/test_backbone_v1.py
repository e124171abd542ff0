"""The backbone v1 tests the backbone spec (seed 004) names."""

from __future__ import annotations

import pytest
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.blocks import MLP, RMSNorm
from niels_gpt.model.gpt import GPT


def _tiny() -> ModelConfig:
    return ModelConfig(V=97, T=16, C=32, L=2, H=4, d_ff=48, dropout=0.1)


@pytest.mark.invariant("backbone_v1.forward_shape_dtype")
def test_forward_shape_and_dtype(device: torch.device) -> None:
    cfg = _tiny()
    model = GPT(cfg).to(device).eval()
    x = torch.randint(0, cfg.V, (3, 11), device=device)  # (B, t)
    logits = model(x)
    assert logits.shape == (3, 11, cfg.V)
    assert logits.dtype == torch.float32
    assert logits.device == x.device


@pytest.mark.invariant("backbone_v1.trace_contract")
def test_trace_contract(device: torch.device) -> None:
    cfg = _tiny()
    model = GPT(cfg).to(device).eval()
    B, t = 2, 9
    x = torch.randint(0, cfg.V, (B, t), device=device)  # (B, t)

    logits, trace = model.forward_with_attn_trace(x, trace_layer=1, return_full_attn=False)
    assert logits.shape == (B, t, cfg.V)
    assert trace["layer"] == 1
    assert trace["attn_row"].shape == (B, cfg.H, t)
    assert trace["attn_row"].dtype == torch.float32
    assert trace["attn_row"].device == x.device
    assert trace["attn_full"] is None

    _, trace = model.forward_with_attn_trace(x, trace_layer=0, return_full_attn=True)
    full = trace["attn_full"]
    assert full is not None
    assert full.shape == (B, cfg.H, t, t)
    assert full.dtype == torch.float32
    torch.testing.assert_close(
        full.sum(dim=-1), torch.ones(B, cfg.H, t, device=device), rtol=0, atol=1e-4
    )


@pytest.mark.invariant("backbone_v1.rmsnorm_no_bias")
def test_rmsnorm_has_no_bias() -> None:
    norm = RMSNorm(64)
    assert not hasattr(norm, "bias") or norm.bias is None
    assert [name for name, _ in norm.named_parameters()] == ["weight"]
    assert norm.weight.shape == (64,)
    assert norm.eps == 1e-5


@pytest.mark.invariant("backbone_v1.swiglu_shapes")
def test_swiglu_projection_shapes() -> None:
    cfg = ModelConfig(V=256, C=512, d_ff=1536)
    mlp = MLP(cfg)
    shapes = [(lin.in_features, lin.out_features) for lin in (mlp.w_a, mlp.w_g, mlp.w_o)]
    assert shapes == [(512, 1536), (512, 1536), (1536, 512)]
    assert all(lin.bias is not None for lin in (mlp.w_a, mlp.w_g, mlp.w_o))
    linears = [m for m in mlp.modules() if isinstance(m, torch.nn.Linear)]
    assert len(linears) == 3
