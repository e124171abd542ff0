"""Every ModelConfig field GPT v1 and its parts read, and the RMSNorm eps knob.

GPT reads V (embedding and head), C (widths), L (blocks), T (the length
check, through every attention), dropout (embedding dropout and every block)
and d_ff, H, rope_theta through its blocks. Each field is set away from its
default here; a model built from the default instead fails.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from niels_gpt.config import ModelConfig
from niels_gpt.model.blocks import MLP, Block, RMSNorm
from niels_gpt.model.gpt import GPT
from niels_gpt.model.rope import rope_cache


@pytest.mark.invariant("backbone_v1.config_fields")
@given(
    V=st.integers(2, 50),
    T=st.integers(1, 9),
    H=st.integers(1, 3),
    half=st.integers(1, 3),
    L=st.integers(1, 3),
    d_ff=st.integers(1, 40),
    dropout=st.floats(0.0, 0.9),
    theta=st.sampled_from([10.0, 1e6]),
)
def test_each_field_shapes_the_model(
    V: int, T: int, H: int, half: int, L: int, d_ff: int, dropout: float, theta: float
) -> None:
    C = H * 2 * half
    cfg = ModelConfig(V=V, T=T, C=C, L=L, H=H, d_ff=d_ff, dropout=dropout, rope_theta=theta)
    model = GPT(cfg)
    assert model.tok_emb.weight.shape == (V, C) and model.lm_head.out_features == V
    assert len(model.blocks) == L and model.ln_f.dim == C
    rates = [m.p for m in model.modules() if isinstance(m, nn.Dropout)]
    assert rates == [dropout] * (1 + 3 * L)  # embedding, then per block attn x2 + residual
    sin, _ = rope_cache(T, 2 * half, theta=theta)
    for block in model.blocks:
        assert isinstance(block, Block) and block.ln1.dim == block.ln2.dim == C
        assert (block.mlp.w_a.out_features, block.mlp.w_g.out_features) == (d_ff, d_ff)
        assert block.mlp.w_o.in_features == d_ff
        assert block.attn.n_head == H and torch.equal(block.attn.rope_sin, sin)
    mlp = MLP(cfg)
    assert (mlp.w_a.in_features, mlp.w_a.out_features, mlp.w_o.out_features) == (C, d_ff, C)
    with pytest.raises(AssertionError, match=rf"\[1, {T}\].*got {T + 1}"):
        model(torch.zeros(1, T + 1, dtype=torch.int64))


@pytest.mark.invariant("backbone_v1.config_fields")
def test_dropout_field_reaches_the_embeddings(device: torch.device) -> None:
    for p in (0.2, 0.7):
        cfg = ModelConfig(V=16, T=8, C=16, L=1, H=2, d_ff=16, dropout=p)
        model = GPT(cfg).to(device).train()
        dropped: list[torch.Tensor] = []
        model.drop.register_forward_hook(lambda m, i, o, seen=dropped: seen.append(o))
        torch.manual_seed(0)
        with torch.no_grad():
            model(torch.randint(0, cfg.V, (256, cfg.T), device=device))
        assert abs((dropped[0] == 0).float().mean().item() - p) < 0.02, p


@pytest.mark.invariant("backbone_v1.rmsnorm_matches_reference")
@pytest.mark.invariant("backbone_v1.config_fields")
@given(
    eps=st.sampled_from([1e-6, 1e-3, 0.25, 4.0]),
    scale=st.sampled_from([1e-3, 1.0, 30.0]),
    C=st.integers(1, 16),
    seed=st.integers(0, 2**16),
)
def test_rmsnorm_eps_is_read(eps: float, scale: float, C: int, seed: int) -> None:
    """RMSNorm(dim, eps) at non-default eps, on inputs where eps matters, in float64."""
    gen = torch.Generator().manual_seed(seed)
    norm = RMSNorm(C, eps=eps).double()
    with torch.no_grad():
        norm.weight.copy_(torch.randn(C, generator=gen, dtype=torch.float64))
    x = torch.randn(3, C, generator=gen, dtype=torch.float64) * scale  # (3, C)
    expected = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * norm.weight  # (3, C)
    assert norm.eps == eps and f"eps={eps}" in repr(norm)
    torch.testing.assert_close(norm(x), expected, rtol=1e-12, atol=0)
    with pytest.raises(ValueError, match="eps"):
        RMSNorm(C, eps=0.0)
