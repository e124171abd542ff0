"""Acceptance tests of block 1.3: the block's norms and MLP come from two builders.

``Block.make_norm(cfg)`` builds ``ln1`` and ``ln2`` and ``Block.make_mlp(cfg)``
builds ``mlp``, in the constructor's one order (ln1, attn, ln2, mlp, dropout),
so a later block that overrides only the builders (v1: RMSNorm and SwiGLU)
keeps this stage's wiring, input checks and seeded weights. The subclass here
uses a norm and an MLP unlike either stage's: each draws its weights from the
global generator (so the order of construction shows in seeded weights) and
the norm has a ``weight`` but no ``normalized_shape``.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.block_v0 import MLP, Block

CFG = ModelConfig(V=8, T=6, C=12, H=3, d_ff=20, dropout=0.3)


class ScaleNorm(nn.Module):
    """``x * weight`` over the last dim; the ``(C,)`` weight drawn from N(1, 0.1)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(dim))  # (C,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.weight  # (B, T, C)


class TanhMLP(nn.Module):
    """``tanh(Linear(C, C))``: an MLP neither stage builds."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.lin = nn.Linear(cfg.C, cfg.C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.lin(x))  # (B, T, C)


class ScaleBlock(Block):
    """A block that overrides only the builders, and logs their calls in ``built``."""

    built: list[str]

    def make_norm(self, cfg: ModelConfig) -> nn.Module:
        self.__dict__.setdefault("built", []).append("norm")
        return ScaleNorm(cfg.C)

    def make_mlp(self, cfg: ModelConfig) -> nn.Module:
        self.__dict__.setdefault("built", []).append("mlp")
        return TanhMLP(cfg)


@pytest.mark.invariant("block.builders")
def test_default_builders_are_the_v0_parts() -> None:
    block = Block(CFG)
    for norm in (block.ln1, block.ln2, block.make_norm(CFG)):
        assert type(norm) is nn.LayerNorm
        assert norm.normalized_shape == (CFG.C,) and norm.eps == 1e-5
    for mlp in (block.mlp, block.make_mlp(CFG)):
        assert type(mlp) is MLP
        assert (mlp.fc.in_features, mlp.fc.out_features) == (CFG.C, CFG.d_ff)
    assert block.ln1 is not block.ln2
    assert [name for name, _ in block.named_children()] == ["ln1", "attn", "ln2", "mlp", "dropout"]


@pytest.mark.invariant("block.builders")
@given(seed=st.integers(0, 2**31 - 1))
def test_subclass_parts_are_drawn_in_the_constructors_order(seed: int) -> None:
    torch.manual_seed(seed)
    block = ScaleBlock(CFG)
    torch.manual_seed(seed)
    parts = [ScaleNorm(CFG.C), CausalSelfAttention(CFG), ScaleNorm(CFG.C), TanhMLP(CFG)]
    assert block.built == ["norm", "norm", "mlp"]
    assert [type(m) for m in (block.ln1, block.attn, block.ln2, block.mlp)] == [
        ScaleNorm,
        CausalSelfAttention,
        ScaleNorm,
        TanhMLP,
    ]
    assert [name for name, _ in block.named_children()] == ["ln1", "attn", "ln2", "mlp", "dropout"]
    assert isinstance(block.dropout, nn.Dropout) and block.dropout.p == CFG.dropout
    expected = nn.ModuleDict(dict(zip(["ln1", "attn", "ln2", "mlp"], parts, strict=True)))
    got, want = block.state_dict(), expected.state_dict()
    assert list(got) == list(want)
    for name, tensor in want.items():
        assert torch.equal(got[name], tensor), name


@pytest.mark.invariant("block.builders")
def test_subclass_runs_the_v0_wiring_with_its_own_parts(device: torch.device) -> None:
    torch.manual_seed(3)
    block = ScaleBlock(CFG).to(device).eval()
    assert isinstance(block.ln1, ScaleNorm) and isinstance(block.mlp, TanhMLP)
    x = torch.randn(2, 5, CFG.C, device=device)  # (B, T, C)
    with torch.no_grad():
        y, probs = block(x, return_attn=True)  # (B, T, C), (B, H, T, T)
        attn_out, attn_probs = block.attn(block.ln1(x), return_attn=True)  # (B, T, C), (B, H, T, T)
        h = x + attn_out  # (B, T, C)
        expected = h + block.mlp(block.ln2(h))  # (B, T, C)
        plain = block(x)  # (B, T, C)
    assert torch.equal(y, expected) and torch.equal(plain, expected)
    assert torch.equal(probs, attn_probs)
    block.train()
    torch.manual_seed(4)
    dropped = block(x)  # (B, T, C)
    torch.manual_seed(4)
    attn_out = nn.functional.dropout(block.attn(block.ln1(x)), CFG.dropout)  # (B, T, C)
    h = x + attn_out  # (B, T, C)
    expected = h + nn.functional.dropout(block.mlp(block.ln2(h)), CFG.dropout)  # (B, T, C)
    assert torch.equal(dropped, expected)


@pytest.mark.invariant("block.builders")
def test_subclass_input_is_checked_against_its_norms_weight() -> None:
    block = ScaleBlock(CFG)
    assert isinstance(block.ln1, ScaleNorm)  # no normalized_shape: the width is its weight's
    with pytest.raises(InputError, match=rf"last dim must be {CFG.C}\b.*got {CFG.C + 1}"):
        block(torch.randn(2, 3, CFG.C + 1))
    with pytest.raises(InputError, match=r"must have 3 dims, got 2"):
        block(torch.randn(3, CFG.C))
    with pytest.raises(InputError, match=r"dtype must match the block.*float32.*float64"):
        block(torch.randn(2, 3, CFG.C, dtype=torch.float64))
    block.double()
    assert block(torch.randn(2, 3, CFG.C, dtype=torch.float64)).dtype == torch.float64
