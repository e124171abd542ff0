"""v0 and v1 come from the stage wheels; equal parameter counts; v0's wiring."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

import niels_gpt.model.block_v0 as stage_block
import niels_gpt.model.blocks as stage_blocks
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt_experiments.models import (
    GPTv0,
    build_model,
    count_params,
    matched_v0_d_ff,
    n_params,
)

sizes = st.builds(
    lambda h, d, L, f, V: ModelConfig(V=V, T=8, C=h * d, L=L, H=h, d_ff=f),
    h=st.integers(1, 4),
    d=st.sampled_from([2, 4, 8]),
    L=st.integers(1, 3),
    f=st.integers(1, 64),
    V=st.integers(2, 300),
)


def test_both_models_are_the_stage_classes() -> None:
    cfg = ModelConfig(V=256, T=16, C=16, L=2, H=2, d_ff=24)
    v1, v0 = build_model("v1", cfg), build_model("v0", cfg)
    assert type(v1) is GPT and isinstance(v0, GPT)
    assert all(type(b) is stage_blocks.Block for b in v1.blocks)
    assert all(type(b) is stage_block.Block for b in v0.blocks)
    assert type(v0.ln_f) is nn.LayerNorm and v0.ln_f.eps == 1e-5
    assert type(v1.ln_f) is stage_blocks.RMSNorm
    for model in (v0, v1):
        assert model.lm_head.weight is model.tok_emb.weight and model.lm_head.bias is None
    with pytest.raises(ValueError, match="model kind must be 'v0' or 'v1', got 'v2'"):
        build_model("v2", cfg)  # type: ignore[arg-type]


@given(cfg=sizes)
def test_counted_parameters_equal_the_built_models(cfg: ModelConfig) -> None:
    for kind in ("v0", "v1"):
        assert count_params(kind, cfg) == n_params(build_model(kind, cfg))  # type: ignore[arg-type]


@given(cfg=sizes)
def test_matched_width_is_the_closest_count(cfg: ModelConfig) -> None:
    target = count_params("v1", cfg)
    best = matched_v0_d_ff(cfg)

    def gap(f: int) -> int:
        return abs(count_params("v0", dataclasses.replace(cfg, d_ff=f)) - target)

    assert all(gap(best) <= gap(f) for f in range(max(1, best - 3), best + 4))


def test_v0_logits_are_layernorm_blocks_then_layernorm_then_the_tied_head(
    device: torch.device, randomise: Callable[[nn.Module, int], None]
) -> None:
    cfg = ModelConfig(V=40, T=12, C=16, L=2, H=2, d_ff=20, dropout=0.0)
    model = GPTv0(cfg).to(device=device, dtype=torch.float64).eval()
    randomise(model, 3)
    x = torch.randint(0, cfg.V, (3, 12), device=device)
    h = model.tok_emb.weight[x]  # (B, t, C)
    for block in model.blocks:
        h = block(h)  # (B, t, C), the stage's own v0 block
    ln_f = F.layer_norm(h, (cfg.C,), model.ln_f.weight, model.ln_f.bias, eps=1e-5)  # (B, t, C)
    want = ln_f @ model.tok_emb.weight.T  # (B, t, V)
    torch.testing.assert_close(model(x), want, rtol=1e-10, atol=1e-12)
