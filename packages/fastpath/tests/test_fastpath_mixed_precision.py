"""The fast path under ``torch.autocast`` and in a half-precision model, on the session's device.

The reference is the explicit GPT with the same weights, converted to float64
on the CPU (the backbone stage proves it against the formulas). SDPA rounds no
more often than the explicit core (one output per call), so the explicit
path's rounding stages bound it: six per block and one for the head under
autocast, ten per block and two at the end in a half model (see the root
conftest's ``mixed_close``); a backward pass counts double.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.fastpath import sdpa_kernel, use_fast_attention
from niels_gpt.model.gpt import GPT

MixedClose = Callable[..., None]


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    H = draw(st.integers(1, 3))
    D = 2 * draw(st.integers(1, 4))
    return ModelConfig(
        V=draw(st.integers(2, 40)),
        T=draw(st.integers(1, 12)),
        C=H * D,
        L=draw(st.integers(1, 2)),
        H=H,
        d_ff=draw(st.integers(1, 24)),
        dropout=0.0,
    )


@pytest.mark.invariant("fastpath.mixed_precision")
@given(cfg=configs(), half_model=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_fast_path_within_derived_bound_of_float64_explicit(
    device: torch.device,
    autocast_dtypes: tuple[torch.dtype, ...],
    mixed_close: MixedClose,
    mixed_close_grads: MixedClose,
    cfg: ModelConfig,
    half_model: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(autocast_dtypes))
    t = data.draw(st.integers(1, cfg.T))
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    param_dtype = dtype if half_model else torch.float32
    model.to(param_dtype)
    ref = copy.deepcopy(model).double()  # explicit, the same (rounded) weights
    use_fast_attention(model).to(device)
    assert all(b.attn.kernel is sdpa_kernel for b in model.blocks)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.V, (2, t), generator=gen)  # (B, t)
    g = torch.randn(2, t, cfg.V, generator=gen)  # (B, t, V) upstream gradient

    with torch.autocast(device.type, dtype=dtype, enabled=not half_model):
        logits = model(x.to(device))  # (B, t, V)
        grads = torch.autograd.grad((logits.float() * g.to(device)).sum(), model.parameters())
    assert logits.dtype == dtype and logits.shape == (2, t, cfg.V)
    assert [gr.dtype for gr in grads] == [param_dtype] * len(grads)

    logits64 = ref(x)
    grads64 = torch.autograd.grad((logits64 * g.double()).sum(), ref.parameters())
    n = max(cfg.C, cfg.d_ff, cfg.V, 2 * t)
    stages = cfg.L * (10 if half_model else 6) + (2 if half_model else 1)
    mixed_close(logits, logits64, dtype=dtype, stages=stages, reduction=n)
    mixed_close_grads(list(grads), list(grads64), dtype=dtype, stages=2 * stages, reduction=n)


@pytest.mark.invariant("fastpath.mixed_precision")
def test_trace_under_autocast_is_the_explicit_trace(
    device: torch.device, autocast_dtypes: tuple[torch.dtype, ...]
) -> None:
    """return_attn runs the explicit parent under autocast too: float32 probabilities,
    bit for bit the explicit model's at layer 0 (same input to the traced block)."""
    cfg = ModelConfig(V=50, T=CausalSelfAttention.QUERY_BLOCK + 9, C=32, L=2, H=4, d_ff=40)
    explicit = GPT(cfg).to(device).eval()
    fast = use_fast_attention(copy.deepcopy(explicit))
    x = torch.randint(0, cfg.V, (2, cfg.T), generator=torch.Generator().manual_seed(0))
    x = x.to(device)  # (B, t)
    for dtype in autocast_dtypes:
        with torch.no_grad(), torch.autocast(device.type, dtype=dtype):
            _, trace_e = explicit.forward_with_attn_trace(x, 0, return_full_attn=True)
            logits_f, trace_f = fast.forward_with_attn_trace(x, 0, return_full_attn=True)
            plain_f = fast(x)
        full_e, full_f = trace_e["attn_full"], trace_f["attn_full"]
        assert full_e is not None and full_f is not None
        assert full_f.dtype == trace_f["attn_row"].dtype == torch.float32
        assert torch.equal(full_f, full_e)
        assert logits_f.dtype == plain_f.dtype == dtype
