"""Grouped-query attention in the one attention: H_kv key/value heads (cfg.H_kv).

The reference is the definition: multi-head attention whose key/value heads
are each repeated G = H // H_kv times (``repeat_interleave``), built here as an
``H_kv = H`` module with those rows of ``qkv`` repeated.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache

LONG = CausalSelfAttention.QUERY_BLOCK + 9  # two query blocks
CFG = ModelConfig(V=2, T=LONG, C=48, H=6, dropout=0.0)  # D = 8


def _pair(device: torch.device, h_kv: int) -> tuple[CausalSelfAttention, CausalSelfAttention]:
    """A grouped module in float64 and the multi-head module it defines."""
    cfg = dataclasses.replace(CFG, H_kv=h_kv)
    torch.manual_seed(h_kv)
    gqa = CausalSelfAttention(cfg).to(device, torch.float64)
    mha = CausalSelfAttention(CFG).to(device, torch.float64)
    c, kv = CFG.C, h_kv * CFG.head_dim
    wq, wk, wv = torch.split(gqa.qkv.weight.detach(), [c, kv, kv])  # (C, C), (kv, C), (kv, C)
    g = CFG.H // h_kv
    rep = [w.view(h_kv, -1, c).repeat_interleave(g, 0).view(-1, c) for w in (wk, wv)]
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, *rep]))  # (3C, C)
        mha.proj.weight.copy_(gqa.proj.weight)
    return gqa, mha


@pytest.mark.invariant("attention.config_fields")
@pytest.mark.parametrize("h_kv", [1, 2, 3, 6])
def test_sizes_and_heads(h_kv: int) -> None:
    attn = CausalSelfAttention(dataclasses.replace(CFG, H_kv=h_kv))
    assert (attn.n_head, attn.n_kv_head) == (6, h_kv)
    assert attn.qkv.weight.shape == (CFG.C + 2 * h_kv * CFG.head_dim, CFG.C)


@pytest.mark.invariant("attention.matches_reference")
@pytest.mark.parametrize("h_kv", [1, 2, 3])
def test_grouped_equals_repeated_heads_forward_backward_over_blocks(
    device: torch.device, h_kv: int
) -> None:
    gqa, mha = _pair(device, h_kv)
    x = torch.randn(2, LONG, CFG.C, dtype=torch.float64, device=device)  # (2, T, C)
    y, p = gqa(x, return_attn=True)  # (2, T, C), (2, H, T, T)
    y_ref, p_ref = mha(x, return_attn=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(p, p_ref, rtol=1e-12, atol=1e-12)
    y.square().sum().backward()
    y_ref.square().sum().backward()
    torch.testing.assert_close(gqa.proj.weight.grad, mha.proj.weight.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.invariant("attention.cache_appends")
@pytest.mark.invariant("attention.positions_rotate")
@pytest.mark.invariant("attention.key_mask_hides")
@pytest.mark.parametrize("h_kv", [1, 3])
def test_cache_of_kv_heads_positions_and_key_mask(device: torch.device, h_kv: int) -> None:
    gqa, mha = _pair(device, h_kv)
    x = torch.randn(2, 20, CFG.C, dtype=torch.float64, device=device)  # (2, 20, C)
    mask = torch.ones(2, 20, dtype=torch.bool, device=device)  # (2, 20)
    mask[1, :4] = False
    pos = (torch.arange(20, device=device) - 4 * mask.logical_not().any(1, keepdim=True)).clamp(
        min=0
    )
    with torch.no_grad():
        want = mha(x, positions=pos, key_mask=mask)  # (2, 20, C)
        got = gqa(x, positions=pos, key_mask=mask)
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
        gqa.kv_cache = KVCache(2, h_kv, LONG, CFG.head_dim, dtype=torch.float64, device=device)
        parts = [gqa(x[:, :7]), gqa(x[:, 7:8]), gqa(x[:, 8:])]  # (2, *, C) each
        torch.testing.assert_close(torch.cat(parts, 1), mha(x), rtol=1e-12, atol=1e-12)


@pytest.mark.invariant("attention.call_checked")
def test_a_cache_of_query_heads_is_refused(device: torch.device) -> None:
    attn = CausalSelfAttention(dataclasses.replace(CFG, H_kv=2)).to(device)
    attn.kv_cache = KVCache(1, CFG.H, LONG, CFG.head_dim, dtype=torch.float32, device=device)
    with pytest.raises(InputError, match=r"must be \(2, 8\), got \(6, 8\)"):
        attn(torch.zeros(1, 3, CFG.C, device=device))
    assert len(attn.kv_cache) == 0
