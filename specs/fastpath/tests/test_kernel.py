"""Acceptance tests of fastpath 2.0 and 3.0: SDPA is a kernel of the one attention, nothing more.

``use_fast_attention`` sets each attention module's ``kernel`` and changes
nothing else; the attention stage decides where a kernel may serve, and a fast
model's calls with probabilities or a key mask never reach SDPA. ``sdpa_kernel``
is checked against a float64 causal attention written from the definition,
with as many keys as queries (2.0) and with more, as a KV cache hands them
over (3.0: query ``i`` of ``T`` sees keys ``0 .. S - T + i`` of ``S``).
"""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache
from niels_gpt.model.fastpath import (
    FastCausalSelfAttention,
    sdpa_kernel,
    use_explicit_attention,
    use_fast_attention,
)
from niels_gpt.model.gpt import GPT

CFG = ModelConfig(V=23, T=12, C=16, L=2, H=2, d_ff=20, dropout=0.0, rope_theta=300.0)


def _causal64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """softmax over keys 0..S-T+i of (q_i . k_j) * scale, then the weighted v: float64, CPU.

    ``q`` is ``(..., T, D)``, ``k`` and ``v`` ``(..., S, D)`` with ``S >= T``.
    """
    q, k, v = (t.detach().cpu().double() for t in (q, k, v))
    T, p = q.shape[-2], k.shape[-2] - q.shape[-2]
    out = torch.zeros_like(q)
    for i in range(T):
        seen = p + i + 1  # keys 0 .. p + i
        w = torch.softmax((q[..., i : i + 1, :] @ k[..., :seen, :].transpose(-2, -1)) * scale, -1)
        out[..., i, :] = (w @ v[..., :seen, :])[..., 0, :]
    return out


@pytest.mark.invariant("fastpath.kernel_one_place")
@given(T=st.integers(1, 9), D=st.sampled_from([2, 4, 8]), seed=st.integers(0, 10**6))
def test_the_sdpa_kernel_is_causal_attention(
    device: torch.device, T: int, D: int, seed: int
) -> None:
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(2, 3, T, D, generator=gen) for _ in range(3))  # (B, H, T, D)
    for scale in (1 / math.sqrt(D), 0.37):
        got = sdpa_kernel(q.to(device), k.to(device), v.to(device), 0.0, scale)
        torch.testing.assert_close(
            got.cpu().double(), _causal64(q, k, v, scale), rtol=1e-4, atol=1e-5
        )


@pytest.mark.invariant("fastpath.kernel_bottom_right")
@given(
    T=st.integers(1, 6),
    p=st.integers(1, 9),
    D=st.sampled_from([2, 4, 8]),
    dtype=st.sampled_from([torch.float32, torch.float64]),
    seed=st.integers(0, 10**6),
)
def test_the_sdpa_kernel_with_cached_keys_is_causal_from_the_bottom_right(
    device: torch.device, T: int, p: int, D: int, dtype: torch.dtype, seed: int
) -> None:
    """3.0: ``T`` queries after ``p`` cached positions see keys ``0 .. p + i``."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, T, D, generator=gen, dtype=dtype)  # (B, H, T, D)
    k, v = (torch.randn(2, 3, p + T, D, generator=gen, dtype=dtype) for _ in range(2))
    tol = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-10, 1e-12)}[dtype]
    scale = 1 / math.sqrt(D)
    got = sdpa_kernel(q.to(device), k.to(device), v.to(device), 0.0, scale)  # (B, H, T, D)
    assert got.shape == q.shape and got.dtype == dtype
    want = _causal64(q, k, v, scale)  # (B, H, T, D)
    torch.testing.assert_close(got.cpu().double(), want, rtol=tol[0], atol=tol[1])
    # the last key is visible to the last query only when T > 1: changing it moves that row
    k2 = k.clone()
    k2[..., -1, :] += 3.0
    moved = sdpa_kernel(q.to(device), k2.to(device), v.to(device), 0.0, scale).cpu()
    assert torch.equal(moved[..., :-1, :], got.cpu()[..., :-1, :])


@pytest.mark.invariant("fastpath.kernel_one_place")
def test_the_switch_sets_the_kernel_and_nothing_else(device: torch.device) -> None:
    model = GPT(CFG).to(device)
    before = [(id(m), type(m), sorted(vars(m))) for m in model.modules()]
    state = {k: v.clone() for k, v in model.state_dict().items()}
    use_fast_attention(model)
    assert [(id(m), type(m), sorted(vars(m))) for m in model.modules()] == before
    assert all(b.attn.kernel is sdpa_kernel for b in model.blocks)
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())
    use_explicit_attention(model)
    assert all(b.attn.kernel is None for b in model.blocks)
    assert FastCausalSelfAttention(CFG).kernel is sdpa_kernel
    assert CausalSelfAttention(CFG).kernel is None


@pytest.mark.invariant("fastpath.kernel_one_place")
def test_calls_with_probabilities_or_a_key_mask_never_reach_sdpa(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    attn = FastCausalSelfAttention(CFG).to(device).eval()
    calls: list[int] = []
    real = F.scaled_dot_product_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counted)
    x = torch.randn(2, 6, CFG.C, device=device)  # (B, T, C)
    attn(x)
    assert calls == [1]  # the plain call: SDPA
    attn(x, return_attn=True)
    attn(x, key_mask=torch.ones(2, 6, dtype=torch.bool, device=device))
    attn.kv_cache = KVCache(2, CFG.H, CFG.T, CFG.C // CFG.H, dtype=x.dtype, device=device)
    attn(x[:, :4], return_attn=True)
    attn(x[:, 4:], key_mask=torch.ones(2, 6, dtype=torch.bool, device=device))
    assert calls == [1]  # probabilities or a key mask, cached or not: the explicit core


def _rope_attention64(attn: CausalSelfAttention, x: torch.Tensor) -> torch.Tensor:
    """Causal attention with RoPE written from the definitions: float64, CPU.

    RoPE as a complex turn ``exp(i p theta^(-2j/D))`` of each channel pair, the
    angles' sin/cos rounded to float32 as the tables are built.
    """
    cfg = attn.cfg
    x = x.detach().cpu().double()
    B, T, C = x.shape
    H, D = cfg.H, C // cfg.H
    q, k, v = (x @ attn.qkv.weight.detach().cpu().double().T).split(C, dim=-1)  # (B, T, C) each
    pos = torch.arange(T, dtype=torch.float64)[:, None]  # (T, 1)
    ang = pos * cfg.rope_theta ** (-2 * torch.arange(D // 2, dtype=torch.float64) / D)  # (T, D/2)
    turn = torch.complex(ang.cos().float().double(), ang.sin().float().double())  # (T, D/2)

    def rot(t: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(t.reshape(B, T, H, D // 2, 2).contiguous())  # (B, T, H, D/2)
        return torch.view_as_real(z * turn[None, :, None]).reshape(B, T, H, D).transpose(1, 2)

    vh = v.reshape(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
    out = _causal64(rot(q), rot(k), vh, 1 / math.sqrt(D))  # (B, H, T, D)
    return out.transpose(1, 2).reshape(B, T, C) @ attn.proj.weight.detach().cpu().double().T


@pytest.mark.invariant("fastpath.kernel_one_place")
@pytest.mark.invariant("fastpath.eval_matches_explicit")
@given(T=st.integers(1, CFG.T), seed=st.integers(0, 10**6))
def test_a_fast_module_is_rope_attention(device: torch.device, T: int, seed: int) -> None:
    torch.manual_seed(seed)
    attn = FastCausalSelfAttention(CFG).to(device).eval()
    x = torch.randn(2, T, CFG.C, generator=torch.Generator().manual_seed(seed))  # (B, T, C)
    got = attn(x.to(device))  # (B, T, C) through SDPA
    torch.testing.assert_close(got.cpu().double(), _rope_attention64(attn, x), rtol=1e-4, atol=1e-5)


@pytest.mark.invariant("fastpath.kernel_bottom_right")
@pytest.mark.invariant("fastpath.eval_matches_explicit")
@given(T=st.integers(2, CFG.T), cut=st.integers(1, CFG.T - 1), seed=st.integers(0, 10**6))
def test_cached_calls_of_a_fast_module_reach_sdpa_and_are_rope_attention(
    device: torch.device, T: int, cut: int, seed: int
) -> None:
    """3.1: with attention 2.0 a prefill, a one-token step and a chunk through a KV cache
    all run SDPA, and together they are the whole sequence's RoPE attention."""
    cut = min(cut, T - 1)  # a prefill of cut tokens, one step, then the rest (maybe none)
    torch.manual_seed(seed)
    attn = FastCausalSelfAttention(CFG).to(device).eval()
    x = torch.randn(2, T, CFG.C, generator=torch.Generator().manual_seed(seed))  # (B, T, C)
    calls: list[int] = []
    real = F.scaled_dot_product_attention

    def counted(*args: Any, **kwargs: Any) -> torch.Tensor:
        calls.append(1)
        return real(*args, **kwargs)

    attn.kv_cache = KVCache(2, CFG.H, CFG.T, CFG.C // CFG.H, dtype=x.dtype, device=device)
    pieces = [(0, cut), (cut, cut + 1), (cut + 1, T)]
    with torch.no_grad(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(F, "scaled_dot_product_attention", counted)
        outs = [attn(x[:, a:b].to(device)) for a, b in pieces if b > a]  # (B, b - a, C) each
    assert len(calls) == len(outs)  # every cached call: SDPA
    got = torch.cat(outs, dim=1)  # (B, T, C)
    torch.testing.assert_close(got.cpu().double(), _rope_attention64(attn, x), rtol=1e-4, atol=1e-5)
