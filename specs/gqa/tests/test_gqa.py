"""Acceptance tests of grouped-query attention (stage gqa), written from the definition:
H_kv key/value heads, each repeated H / H_kv times, is multi-head attention."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import use_fast_attention
from niels_gpt.model.gpt import GPT
from niels_gpt.model.gqa import cache_bytes_per_token, kv_head_of
from niels_gpt.model.kv_cache import drop_kv_cache, generate, use_kv_cache
from niels_gpt.model.padding import padded_forward

CFG = ModelConfig(V=37, T=24, C=32, L=2, H=4, d_ff=40, dropout=0.0)  # D = 8


def _gpt(device: torch.device, h_kv: int | None, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(dataclasses.replace(CFG, H_kv=h_kv)).to(device, torch.float64).eval()


@pytest.mark.invariant("gqa.config")
def test_h_kv_defaults_to_h_and_must_divide_it() -> None:
    assert CFG.H_kv is None and CFG.kv_heads == CFG.H == 4
    assert dataclasses.replace(CFG, H_kv=2).kv_heads == 2
    for bad in (0, 3, 8, -2, True, 2.0):
        with pytest.raises(ValueError, match=rf"H_kv.*H=4.*{bad!r}"):
            dataclasses.replace(CFG, H_kv=bad)
    with pytest.raises(ValueError, match="H_kv"):
        dataclasses.replace(dataclasses.replace(CFG, H_kv=4), H=2)


@pytest.mark.invariant("gqa.mha_exact")
def test_h_kv_equal_to_h_is_the_multi_head_model_bit_for_bit(device: torch.device) -> None:
    default, given = _gpt(device, None), _gpt(device, CFG.H)
    a, b = default.state_dict(), given.state_dict()
    assert list(a) == list(b) and all(torch.equal(a[k], b[k]) for k in a)
    assert a["blocks.0.attn.qkv.weight"].shape == (3 * CFG.C, CFG.C)
    ids = torch.randint(0, CFG.V, (2, CFG.T), device=device)  # (2, T)
    out_a, out_b = default(ids), given(ids)  # (2, T, V) each
    assert torch.equal(out_a, out_b)
    out_a.square().sum().backward()
    out_b.square().sum().backward()
    assert all(
        torch.equal(p.grad, q.grad)
        for p, q in zip(default.parameters(), given.parameters(), strict=True)
    )


@pytest.mark.parametrize("h_kv", [1, 2, 4])
@pytest.mark.invariant("gqa.definition")
def test_grouped_attention_is_multi_head_with_repeated_kv_heads(
    device: torch.device, h_kv: int
) -> None:
    cfg = dataclasses.replace(CFG, H_kv=h_kv)
    torch.manual_seed(1)
    gqa = CausalSelfAttention(cfg).to(device, torch.float64).eval()
    c, kv = cfg.C, h_kv * cfg.head_dim
    assert gqa.qkv.weight.shape == (c + 2 * kv, c)
    mha = CausalSelfAttention(CFG).to(device, torch.float64).eval()
    wq, wk, wv = gqa.qkv.weight.detach().split((c, kv, kv))  # (C, C), (kv, C) x2
    rep = [
        w.unflatten(0, (h_kv, -1)).repeat_interleave(cfg.H // h_kv, 0).flatten(0, 1)
        for w in (wk, wv)
    ]
    with torch.no_grad():
        mha.qkv.weight.copy_(torch.cat([wq, *rep]))  # (3C, C): each K/V head repeated
        mha.proj.weight.copy_(gqa.proj.weight)
        x = torch.randn(3, CFG.T, c, dtype=torch.float64, device=device)  # (3, T, C)
        (y, p), (y_ref, p_ref) = gqa(x, return_attn=True), mha(x, return_attn=True)
    torch.testing.assert_close(y, y_ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(p, p_ref, rtol=1e-12, atol=1e-12)


@pytest.mark.invariant("gqa.cache_heads")
def test_the_cache_holds_h_kv_heads_and_decodes_as_the_forward(device: torch.device) -> None:
    model = _gpt(device, 2)
    ids = torch.randint(0, CFG.V, (2, 12), device=device)  # (2, 12)
    whole = model(ids)  # (2, 12, V)
    caches = use_kv_cache(model, 2)
    assert all(c.keys.shape == (2, 2, CFG.T, CFG.head_dim) for c in caches)
    parts = torch.cat([model(ids[:, :5]), model(ids[:, 5:6]), model(ids[:, 6:])], 1)  # (2, 12, V)
    torch.testing.assert_close(parts, whole, rtol=1e-10, atol=1e-10)
    drop_kv_cache(model)
    out = generate(model, ids[:, :4], 6, temperature=0.0)  # (2, 10)
    loop = ids[:, :4]  # (2, 4)
    for _ in range(6):
        loop = torch.cat([loop, model(loop)[:, -1].argmax(-1, keepdim=True)], 1)  # (2, t + 1)
    assert torch.equal(out, loop)


@pytest.mark.parametrize("h_kv", [1, 2])
@pytest.mark.invariant("gqa.composes")
def test_fast_path_and_padding_compose_with_grouped_heads(device: torch.device, h_kv: int) -> None:
    explicit, fast = _gpt(device, h_kv), use_fast_attention(_gpt(device, h_kv))
    ids = torch.randint(0, CFG.V, (2, 16), device=device)  # (2, 16)
    torch.testing.assert_close(fast(ids), explicit(ids), rtol=1e-10, atol=1e-10)
    use_kv_cache(fast, 2)
    steps = torch.cat([fast(ids[:, :9]), *(fast(ids[:, i : i + 1]) for i in range(9, 16))], 1)
    torch.testing.assert_close(steps, explicit(ids), rtol=1e-10, atol=1e-10)
    mask = torch.ones(2, 16, dtype=torch.bool, device=device)  # (2, 16)
    mask[1, :6] = False  # row 1: 6 pads, then its 10 tokens
    padded = padded_forward(explicit, ids, mask)  # (2, 16, V)
    torch.testing.assert_close(padded[1, 6:], explicit(ids[1:, 6:])[0], rtol=1e-10, atol=1e-10)


@pytest.mark.invariant("gqa.sizes")
def test_cache_bytes_and_the_kv_head_of_each_query_head() -> None:
    cfg = ModelConfig(V=256)  # the default model: L=8, C=512, H=8, D=64
    assert cache_bytes_per_token(cfg) == 8 * 2 * 512 * 4 == 32768
    sizes = [cache_bytes_per_token(dataclasses.replace(cfg, H_kv=h)) for h in (8, 2, 1)]
    assert sizes == [32768, 8192, 4096]
    assert cache_bytes_per_token(cfg, torch.bfloat16) == 16384
    assert [kv_head_of(dataclasses.replace(cfg, H_kv=2), h) for h in range(8)] == [0] * 4 + [1] * 4
    with pytest.raises(InputError, match=r"\[0, 8\).*8"):
        kv_head_of(cfg, 8)
    with pytest.raises(InputError, match="int8"):
        cache_bytes_per_token(cfg, torch.int8)
