"""Every ModelConfig field the attention module reads, at non-default values.

The module reads T (tables, mask, length check), C and H (widths, heads),
dropout (both dropouts) and rope_theta (the tables). Each test here sets the
field away from its default and fails if the module built from the default
instead; the matches-reference tests in ``test_attention_properties.py`` draw
rope_theta as well, so a module that ignored it would also compute wrongly.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.rope import rope_cache


@pytest.mark.invariant("attention.config_fields")
@given(
    H=st.integers(1, 4),
    half=st.integers(1, 4),
    T=st.integers(1, 12),
    dropout=st.floats(0.0, 0.9),
    theta=st.sampled_from([10.0, 500.0, 1e6]),
)
def test_each_field_shapes_the_module(
    H: int, half: int, T: int, dropout: float, theta: float
) -> None:
    cfg = ModelConfig(V=8, T=T, C=H * 2 * half, H=H, d_ff=8, dropout=dropout, rope_theta=theta)
    attn = CausalSelfAttention(cfg)
    assert (attn.n_head, attn.head_dim) == (H, 2 * half)
    assert attn.qkv.weight.shape == (3 * cfg.C, cfg.C) and attn.proj.weight.shape == (cfg.C, cfg.C)
    assert attn.attn_dropout.p == attn.resid_dropout.p == dropout
    assert attn.mask.shape == (1, 1, T, T)
    sin, cos = rope_cache(T, 2 * half, theta=theta)  # (1, 1, T, D/2) each
    assert torch.equal(attn.rope_sin, sin) and torch.equal(attn.rope_cos, cos)


@pytest.mark.invariant("attention.config_fields")
def test_rope_theta_changes_the_output(device: torch.device) -> None:
    """Same weights, same input, another theta: another result from position 1 on."""
    outputs = []
    for theta in (10000.0, 10.0):
        cfg = ModelConfig(V=8, T=6, C=16, H=2, d_ff=8, dropout=0.0, rope_theta=theta)
        torch.manual_seed(0)
        attn = CausalSelfAttention(cfg).to(device).eval()
        x = torch.randn(1, cfg.T, cfg.C, generator=torch.Generator().manual_seed(1))
        outputs.append(attn(x.to(device)))
    torch.testing.assert_close(outputs[0][:, 0], outputs[1][:, 0])  # position 0: no turn
    assert not torch.allclose(outputs[0][:, 1:], outputs[1][:, 1:])


@pytest.mark.invariant("attention.config_fields")
def test_dropout_field_sets_the_drop_rate(device: torch.device) -> None:
    """cfg.dropout reaches both dropouts as a rate: with v = x and identity
    projections, the fraction of zeroed outputs in a one-key row is the rate."""
    for p in (0.25, 0.6):
        cfg = ModelConfig(V=8, T=4, C=8, H=1, d_ff=8, dropout=p)
        attn = CausalSelfAttention(cfg).to(device).train()
        with torch.no_grad():
            attn.qkv.weight.zero_()
            attn.qkv.weight[2 * cfg.C :].copy_(torch.eye(cfg.C))  # v = x
            attn.proj.weight.copy_(torch.eye(cfg.C))
        torch.manual_seed(0)
        with torch.no_grad():
            y = attn(torch.ones(4096, cfg.T, cfg.C, device=device))[:, 0]  # (B, C), one key
        # kept iff both dropouts keep it: rate 1 - (1 - p)^2
        zeroed = (y == 0).float().mean().item()
        assert abs(zeroed - (1 - (1 - p) ** 2)) < 0.02, (p, zeroed)
