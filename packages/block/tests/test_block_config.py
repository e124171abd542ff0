"""Every ModelConfig field the v0 block reads, at non-default values.

The block reads C (norm and MLP widths), d_ff (MLP hidden width) and dropout
(its residual dropout), and hands the config to its attention. Each field is
set away from its default here; a block built from the default instead fails.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from niels_gpt.config import ModelConfig
from niels_gpt.model.block_v0 import MLP, Block


@pytest.mark.invariant("block.config_fields")
@given(
    H=st.integers(1, 3),
    half=st.integers(1, 3),
    d_ff=st.integers(1, 40),
    dropout=st.floats(0.0, 0.9),
    theta=st.sampled_from([10.0, 1e6]),
)
def test_each_field_shapes_the_block(
    H: int, half: int, d_ff: int, dropout: float, theta: float
) -> None:
    cfg = ModelConfig(V=8, T=5, C=H * 2 * half, H=H, d_ff=d_ff, dropout=dropout, rope_theta=theta)
    block = Block(cfg)
    assert block.ln1.normalized_shape == block.ln2.normalized_shape == (cfg.C,)
    for mlp in (block.mlp, MLP(cfg)):
        assert (mlp.fc.in_features, mlp.fc.out_features) == (cfg.C, d_ff)
        assert (mlp.proj.in_features, mlp.proj.out_features) == (d_ff, cfg.C)
    rates = [m.p for m in block.modules() if isinstance(m, nn.Dropout)]
    assert rates == [dropout] * 3  # attention's two and the block's residual dropout
    assert block.attn.cfg is cfg and block.attn.n_head == H


@pytest.mark.invariant("block.config_fields")
def test_dropout_field_sets_the_residual_drop_rate(device: torch.device) -> None:
    """With the attention's own dropouts off, the zeroed fraction of each branch
    (seen at the block's dropout) is cfg.dropout."""
    for p in (0.2, 0.7):
        cfg = ModelConfig(V=8, T=4, C=16, H=2, d_ff=32, dropout=p)
        block = Block(cfg).to(device).train()
        block.attn.attn_dropout.p = block.attn.resid_dropout.p = 0.0
        outputs: list[torch.Tensor] = []
        block.dropout.register_forward_hook(lambda m, i, o, seen=outputs: seen.append(o))
        torch.manual_seed(0)
        with torch.no_grad():
            block(torch.randn(512, cfg.T, cfg.C, device=device))
        for out in outputs:
            assert abs((out == 0).float().mean().item() - p) < 0.02, p
