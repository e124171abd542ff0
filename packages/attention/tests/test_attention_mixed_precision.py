"""Attention under ``torch.autocast`` and as a half-precision module, on the session's device.

The float64 reference is the module itself, copied and converted to float64 on
the CPU: ``test_attention_properties.py`` proves that float64 module equal to
an independent loop-by-loop reference to 1e-10, so what is measured here is the
16-bit arithmetic alone, held to the bound derived in the root conftest
(``mixed_close``). Stage counts: the output passes four matmuls (qkv, scores,
probs @ v, proj), the probabilities two; a backward pass counts double.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import niels_gpt.model.rope as rope
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

MixedClose = Callable[..., None]


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    H = draw(st.integers(1, 3))
    D = 2 * draw(st.integers(1, 4))
    return ModelConfig(V=8, T=draw(st.integers(1, 12)), C=H * D, H=H, d_ff=8, dropout=0.0)


def _check_distribution(probs: torch.Tensor) -> None:
    T = probs.shape[-1]
    above = torch.triu(torch.ones(T, T, dtype=torch.bool, device=probs.device), diagonal=1)
    assert torch.all(probs[..., above] == 0)
    ones = torch.ones(probs.shape[:-1], dtype=probs.dtype, device=probs.device)  # (B, H, T)
    torch.testing.assert_close(probs.sum(-1), ones, rtol=0, atol=T * torch.finfo(probs.dtype).eps)


def _run(
    attn: CausalSelfAttention, x: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``(y, probs, grads of x and of every parameter)`` for the loss ``sum(y * g)``."""
    x = x.detach().requires_grad_()
    y, probs = attn(x, return_attn=True)
    wrt = [x, *attn.parameters()]
    grads = torch.autograd.grad((y.to(g.dtype) * g).sum(), wrt)
    return y, probs, list(grads)


@pytest.mark.invariant("attention.autocast")
@given(cfg=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_autocast_forward_backward_within_derived_bound(
    device: torch.device,
    autocast_dtypes: tuple[torch.dtype, ...],
    mixed_close: MixedClose,
    mixed_close_grads: MixedClose,
    cfg: ModelConfig,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(autocast_dtypes))
    T = data.draw(st.integers(1, cfg.T))
    torch.manual_seed(seed)
    attn = CausalSelfAttention(cfg).eval()
    attn.QUERY_BLOCK = data.draw(st.sampled_from([3, CausalSelfAttention.QUERY_BLOCK]))
    ref = copy.deepcopy(attn).double()
    attn.to(device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, cfg.C, generator=gen)  # (B, T, C)
    g = torch.randn(2, T, cfg.C, generator=gen)  # (B, T, C) upstream gradient

    with torch.autocast(device.type, dtype=dtype):
        y, probs, grads = _run(attn, x.to(device), g.to(device))
    assert (y.dtype, probs.dtype) == (dtype, torch.float32)
    assert [gr.dtype for gr in grads] == [torch.float32] * len(grads)
    assert (y.shape, probs.shape) == ((2, T, cfg.C), (2, cfg.H, T, T))
    _check_distribution(probs)

    y64, probs64, grads64 = _run(ref, x.double(), g.double())
    n = max(cfg.C, 2 * T)
    mixed_close(y, y64, dtype=dtype, stages=4, reduction=n)
    mixed_close(probs, probs64, dtype=dtype, stages=2, reduction=n)
    mixed_close_grads(grads, grads64, dtype=dtype, stages=8, reduction=n)


@pytest.mark.invariant("attention.autocast")
def test_rope_rotates_in_float32_under_autocast(
    device: torch.device, autocast_dtypes: tuple[torch.dtype, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The documented choice: apply_rope gets float32 q, k and tables, never 16-bit ones."""
    cfg = ModelConfig(V=8, T=8, C=16, H=2, d_ff=8, dropout=0.0)
    attn = CausalSelfAttention(cfg).to(device)
    seen: list[tuple[torch.dtype, ...]] = []
    real = rope.apply_rope

    def spy(*args: torch.Tensor) -> Any:
        seen.append(tuple(a.dtype for a in args))
        return real(*args)

    monkeypatch.setattr("niels_gpt.model.rope.apply_rope", spy)
    x = torch.randn(2, cfg.T, cfg.C, device=device)  # (B, T, C)
    for dtype in autocast_dtypes:
        with torch.autocast(device.type, dtype=dtype):
            y = attn(x)
        assert isinstance(y, torch.Tensor) and y.dtype == dtype
    assert seen == [(torch.float32,) * 4] * len(autocast_dtypes)


@pytest.mark.invariant("attention.half_module")
@given(cfg=configs(), seed=st.integers(0, 2**16), data=st.data())
def test_half_precision_module_within_derived_bound(
    device: torch.device,
    autocast_dtypes: tuple[torch.dtype, ...],
    mixed_close: MixedClose,
    mixed_close_grads: MixedClose,
    cfg: ModelConfig,
    seed: int,
    data: st.DataObject,
) -> None:
    """``module.to(bfloat16)``: output in that dtype, float32 probabilities, same bound.

    The reference is the converted module in float64, so both see the same
    rounded weights and tables; the input is rounded to ``dtype`` first.
    """
    dtype = data.draw(st.sampled_from(autocast_dtypes))
    T = data.draw(st.integers(1, cfg.T))
    torch.manual_seed(seed)
    attn = CausalSelfAttention(cfg).to(dtype).eval()
    attn.QUERY_BLOCK = data.draw(st.sampled_from([3, CausalSelfAttention.QUERY_BLOCK]))
    ref = copy.deepcopy(attn).double()
    attn.to(device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, T, cfg.C, generator=gen).to(dtype)  # (B, T, C)
    g = torch.randn(2, T, cfg.C, generator=gen).to(dtype)  # (B, T, C)

    y, probs, grads = _run(attn, x.to(device), g.to(device))
    assert (y.dtype, probs.dtype) == (dtype, torch.float32)
    assert [gr.dtype for gr in grads] == [dtype] * len(grads)
    _check_distribution(probs)
    y64, probs64, grads64 = _run(ref, x.double(), g.double())
    n = max(cfg.C, 2 * T)
    mixed_close(y, y64, dtype=dtype, stages=4, reduction=n)
    mixed_close(probs, probs64, dtype=dtype, stages=2, reduction=n)
    mixed_close_grads(grads, grads64, dtype=dtype, stages=8, reduction=n)
