"""The block v0 tests the block spec (seed 001) names, with V now required."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.block_v0 import MLP, Block, init_weights

V = 256


def _grads_finite(module: torch.nn.Module) -> None:
    grads = [p.grad for p in module.parameters() if p.grad is not None]
    assert grads, "no parameter received a gradient"
    assert all(torch.isfinite(g).all() for g in grads)


@pytest.mark.invariant("block.mlp_shape_grads")
def test_mlp_shape_and_grads_finite(device: torch.device) -> None:
    cfg = ModelConfig(V=V)
    mlp = MLP(cfg)
    mlp.apply(init_weights)
    mlp.to(device)
    x = torch.randn(2, cfg.T, cfg.C, dtype=torch.float32, device=device)  # (B, T, C)
    out = mlp(x)
    assert out.shape == (2, cfg.T, cfg.C)
    out.pow(2).mean().backward()
    _grads_finite(mlp)


@pytest.mark.invariant("block.forward_backward")
@pytest.mark.invariant("block.passes_attn_probs")
def test_block_forward_backward_smoke(device: torch.device) -> None:
    cfg = ModelConfig(V=V)
    block = Block(cfg)
    block.apply(init_weights)
    block.to(device)
    x = torch.randn(2, cfg.T, cfg.C, device=device)  # (B, T, C)
    block.eval()
    assert block(x).shape == (2, cfg.T, cfg.C)
    out = block(x, return_attn=True)
    assert isinstance(out, tuple) and len(out) == 2
    y, attn = out
    assert y.shape == (2, cfg.T, cfg.C)
    assert isinstance(attn, torch.Tensor)
    assert attn.shape[-2:] == (cfg.T, cfg.T)
    y.mean().backward()
    _grads_finite(block)


@pytest.mark.invariant("block.dropout_semantics")
def test_block_dropout_semantics(device: torch.device) -> None:
    cfg_drop = replace(ModelConfig(V=V), dropout=0.5)
    block = Block(cfg_drop)
    block.apply(init_weights)
    block.to(device)
    x = torch.randn(2, cfg_drop.T, cfg_drop.C, device=device)  # (B, T, C)

    block.eval()
    torch.testing.assert_close(block(x), block(x))

    block.train()
    torch.manual_seed(123)
    y1 = block(x)
    y2 = block(x)
    assert not torch.allclose(y1, y2)
