"""Tests of the fastpath stage on the session's device.

The explicit model is the reference: same weights, same inputs, eval mode.
Sequence lengths go past ``CausalSelfAttention.QUERY_BLOCK`` so the explicit
side runs its blocked core, and SDPA checks that too.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.blocks import Block
from niels_gpt.model.fastpath import (
    FastCausalSelfAttention,
    sdpa_kernel,
    use_explicit_attention,
    use_fast_attention,
)
from niels_gpt.model.gpt import GPT

LONG = CausalSelfAttention.QUERY_BLOCK + 45  # two query blocks on the explicit side
CFG = ModelConfig(V=97, T=LONG, C=32, L=3, H=4, d_ff=48, dropout=0.1)


def _tol(dtype: torch.dtype) -> dict[str, float]:
    if dtype == torch.float64:
        return {"rtol": 1e-10, "atol": 1e-10}
    return {"rtol": 1e-4, "atol": 2e-5}


def _tokens(cfg: ModelConfig, B: int, t: int, seed: int, device: torch.device) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, cfg.V, (B, t), generator=gen).to(device)  # (B, t)


def _pair(
    cfg: ModelConfig, device: torch.device, dtype: torch.dtype = torch.float32
) -> tuple[GPT, GPT]:
    explicit = GPT(cfg).to(device=device, dtype=dtype)
    fast = use_fast_attention(copy.deepcopy(explicit))
    assert isinstance(fast, GPT)
    return explicit, fast


@pytest.mark.invariant("fastpath.eval_matches_explicit")
@pytest.mark.parametrize("t", [1, 7, LONG])
def test_eval_logits_match_explicit(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...], t: int
) -> None:
    for dtype in float_dtypes:
        explicit, fast = _pair(CFG, device, dtype)
        x = _tokens(CFG, 2, t, seed=t, device=device)
        with torch.no_grad():
            want = explicit.eval()(x)  # (B, t, V)
            got = fast.eval()(x)  # (B, t, V)
        assert got.dtype == want.dtype == dtype and got.device == want.device
        torch.testing.assert_close(got, want, **_tol(dtype))


@pytest.mark.invariant("fastpath.eval_matches_explicit")
@settings(max_examples=15, deadline=None)
@given(
    H=st.integers(1, 4), half_D=st.integers(1, 8), T=st.integers(1, 40), seed=st.integers(0, 999)
)
def test_attention_module_matches_explicit(
    device: torch.device, H: int, half_D: int, T: int, seed: int
) -> None:
    cfg = ModelConfig(V=8, T=T, C=2 * half_D * H, H=H, d_ff=8, dropout=0.0)
    torch.manual_seed(seed)
    explicit = CausalSelfAttention(cfg).to(device=device)
    fast = FastCausalSelfAttention(cfg).to(device=device)
    fast.load_state_dict(explicit.state_dict())
    x = torch.randn(3, T, cfg.C, device=device)
    torch.testing.assert_close(fast(x), explicit(x), **_tol(torch.float32))


@pytest.mark.invariant("fastpath.grads_match_explicit")
def test_training_grads_match_explicit_without_dropout(
    device: torch.device, float_dtypes: tuple[torch.dtype, ...]
) -> None:
    cfg = ModelConfig(V=CFG.V, T=CFG.T, C=CFG.C, L=CFG.L, H=CFG.H, d_ff=CFG.d_ff, dropout=0.0)
    for dtype in float_dtypes:
        explicit, fast = _pair(cfg, device, dtype)
        x = _tokens(cfg, 2, LONG, seed=1, device=device)
        y = _tokens(cfg, 2, LONG, seed=2, device=device)
        for model in (explicit.train(), fast.train()):
            F.cross_entropy(model(x).flatten(0, 1), y.flatten()).backward()
        for (name, p_e), p_f in zip(explicit.named_parameters(), fast.parameters(), strict=True):
            assert p_e.grad is not None and p_f.grad is not None
            torch.testing.assert_close(p_f.grad, p_e.grad, **_tol(dtype), msg=name)


@pytest.mark.invariant("fastpath.dropout_rate")
def test_sdpa_gets_the_modules_dropout_rate(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    real = F.scaled_dot_product_attention

    def spy(*args: Any, **kwargs: Any) -> torch.Tensor:
        seen.append(kwargs)
        out: torch.Tensor = real(*args, **kwargs)
        return out

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    _, fast = _pair(CFG, device)
    x = _tokens(CFG, 2, 9, seed=0, device=device)
    fast.train()(x)
    assert [c["dropout_p"] for c in seen] == [CFG.dropout] * CFG.L
    assert all(c["is_causal"] is True for c in seen)
    seen.clear()
    fast.eval()(x)
    assert [c["dropout_p"] for c in seen] == [0.0] * CFG.L
    seen.clear()
    fast.blocks[0].attn.attn_dropout.p = 0.3  # the module's own rate, read at call time
    fast.train()(x)
    assert [c["dropout_p"] for c in seen] == [0.3] + [CFG.dropout] * (CFG.L - 1)


@pytest.mark.invariant("fastpath.dropout_rate")
def test_dropout_acts_on_probabilities_with_the_same_rate(device: torch.device) -> None:
    # v = ones: every probability row sums to 1, so the output rows are the sums of
    # the dropped-out probability rows. Their mean is 1 (inverted dropout) and the
    # fraction of zeroed probabilities in a one-key row (t = 0) is the rate.
    p = 0.25
    cfg = ModelConfig(V=8, T=64, C=8, H=1, d_ff=8, dropout=p)
    attn = FastCausalSelfAttention(cfg).to(device).train()
    attn.resid_dropout.p = 0.0
    with torch.no_grad():
        attn.qkv.weight.zero_()
        attn.qkv.weight[2 * cfg.C :].copy_(torch.eye(cfg.C))  # v = x
        attn.proj.weight.copy_(torch.eye(cfg.C))
    x = torch.ones(4096, cfg.T, cfg.C, device=device)
    torch.manual_seed(0)
    with torch.no_grad():
        y = attn(x)[..., 0]  # (B, T): row sums of dropped probabilities
    first = y[:, 0]  # one visible key: 0 or 1 / (1 - p)
    assert (
        torch.isclose(first, torch.zeros_like(first))
        .logical_or(torch.isclose(first, torch.full_like(first, 1 / (1 - p))))
        .all()
    )
    zeroed = torch.isclose(first, torch.zeros_like(first)).float().mean().item()
    assert abs(zeroed - p) < 0.03
    assert abs(y.mean().item() - 1.0) < 0.01


@pytest.mark.invariant("fastpath.trace_unchanged")
@pytest.mark.parametrize("layer", range(CFG.L))
def test_trace_is_the_explicit_trace(device: torch.device, layer: int) -> None:
    explicit, fast = _pair(CFG, device)
    x = _tokens(CFG, 2, LONG, seed=3, device=device)
    with torch.no_grad():
        logits_e, trace_e = explicit.eval().forward_with_attn_trace(x, layer, True)
        logits_f, trace_f = fast.eval().forward_with_attn_trace(x, layer, True)
    assert trace_f["layer"] == trace_e["layer"] == layer
    full_e, full_f = trace_e["attn_full"], trace_f["attn_full"]
    assert full_e is not None and full_f is not None
    assert full_f.shape == full_e.shape == (2, CFG.H, LONG, LONG)
    if layer == 0:  # same input to the traced block: the very same computation
        assert torch.equal(full_f, full_e)
    torch.testing.assert_close(full_f, full_e, **_tol(torch.float32))
    torch.testing.assert_close(trace_f["attn_row"], trace_e["attn_row"], **_tol(torch.float32))
    torch.testing.assert_close(logits_f, logits_e, **_tol(torch.float32))


@pytest.mark.invariant("fastpath.trace_unchanged")
def test_return_attn_runs_the_explicit_parent(
    device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    def forbidden(*args: Any, **kwargs: Any) -> torch.Tensor:
        raise AssertionError("SDPA must not run when the probabilities are asked for")

    monkeypatch.setattr(F, "scaled_dot_product_attention", forbidden)
    attn = FastCausalSelfAttention(CFG).to(device).train()
    y, probs = attn(torch.randn(2, 5, CFG.C, device=device), return_attn=True)
    assert y.shape == (2, 5, CFG.C) and probs.shape == (2, CFG.H, 5, 5)
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs[..., 0]))


@pytest.mark.invariant("fastpath.state_dict_interchangeable")
def test_state_dict_loads_both_ways(device: torch.device) -> None:
    explicit, fast = _pair(CFG, device)
    sd_e, sd_f = explicit.state_dict(), fast.state_dict()
    assert list(sd_f) == list(sd_e)
    for key in sd_e:
        assert torch.equal(sd_f[key], sd_e[key]), key
    other_fast = use_fast_attention(GPT(CFG).to(device))
    other_fast.load_state_dict(sd_e, strict=True)
    other_explicit = GPT(CFG).to(device)
    other_explicit.load_state_dict(fast.state_dict(), strict=True)
    x = _tokens(CFG, 2, LONG, seed=4, device=device)
    with torch.no_grad():
        want = explicit.eval()(x)
        torch.testing.assert_close(other_fast.eval()(x), want, **_tol(torch.float32))
        torch.testing.assert_close(other_explicit.eval()(x), want, rtol=0, atol=0)


@pytest.mark.invariant("fastpath.switch_shares_weights")
def test_switch_is_in_place_and_shares_everything(device: torch.device) -> None:
    model = GPT(CFG).to(device)
    before = dict([*model.named_parameters(), *model.named_buffers()])
    attn_ids = [id(b.attn) for b in model.blocks]
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    assert use_fast_attention(model) is model
    assert [id(b.attn) for b in model.blocks] == attn_ids
    assert all(b.attn.kernel is sdpa_kernel for b in model.blocks)  # the kernel, nothing else
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)
    after = dict([*model.named_parameters(), *model.named_buffers()])
    assert list(after) == list(before)
    assert all(after[n] is before[n] for n in before)
    assert model.lm_head.weight is model.tok_emb.weight
    # the optimizer built before the switch still drives the same tensors
    x = _tokens(CFG, 2, 9, seed=5, device=device)
    model(x).square().mean().backward()
    w = model.blocks[0].attn.qkv.weight
    old = w.detach().clone()
    opt.step()
    assert not torch.equal(w.detach(), old)
    assert use_explicit_attention(model) is model
    assert all(type(b.attn) is CausalSelfAttention for b in model.blocks)
    assert all(b.attn.kernel is None for b in model.blocks)
    assert all(t is before[n] for n, t in [*model.named_parameters(), *model.named_buffers()])


@pytest.mark.invariant("fastpath.switch_shares_weights")
def test_switch_works_on_blocks_and_refuses_unknown_subclasses() -> None:
    block = Block(ModelConfig(V=8, T=8, C=8, H=2, d_ff=8))
    assert use_fast_attention(block) is block
    assert block.attn.kernel is sdpa_kernel and type(block.attn) is CausalSelfAttention

    class Custom(CausalSelfAttention):
        pass

    holder = nn.Sequential(Custom(ModelConfig(V=8, T=8, C=8, H=2, d_ff=8)))
    with pytest.raises(TypeError, match="Custom"):
        use_fast_attention(holder)
    with pytest.raises(TypeError, match=r"nn\.Module"):
        use_fast_attention("not a model")  # type: ignore[arg-type]


@pytest.mark.invariant("fastpath.eval_matches_explicit")
@pytest.mark.parametrize(("h_kv", "t", "s"), [(2, 5, 5), (2, 3, 11), (3, 1, 9), (1, 4, 4)])
def test_sdpa_kernel_reads_grouped_kv_heads_in_repeat_interleave_order(
    device: torch.device, h_kv: int, t: int, s: int
) -> None:
    gen = torch.Generator().manual_seed(h_kv * 100 + t)
    q = torch.randn(2, 6, t, 8, generator=gen, dtype=torch.float64).to(device)  # (B, H, T, D)
    k, v = torch.randn(2, 2, h_kv, s, 8, generator=gen, dtype=torch.float64).to(device)
    got = sdpa_kernel(q, k, v, 0.0, 0.25)  # (B, H, T, D); k, v (B, H_kv, S, D)
    g = 6 // h_kv
    want = sdpa_kernel(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), 0.0, 0.25)
    torch.testing.assert_close(got, want, **_tol(torch.float64))
