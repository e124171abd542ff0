"""GPT v1 under ``torch.autocast`` and as a half-precision model, on the session's device.

The float64 reference is the model itself, copied and converted to float64 on
the CPU (``test_gpt_reference.py`` and ``test_gpt_properties.py`` prove that
float64 model against the formulas). The bound is the root conftest's
``mixed_close``. Rounding stages: under autocast each block adds six matmul
stages (attention four, SwiGLU two) and the head one, the norms and residual
adds running in float32; a half-precision model also rounds each of its two
norms and two residual adds per block and the final norm. A backward pass
counts double; the traced probabilities of layer ``l`` have passed ``l`` whole
blocks and two stages of their own.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT

MixedClose = Callable[..., None]


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    H = draw(st.integers(1, 3))
    D = 2 * draw(st.integers(1, 3))
    return ModelConfig(
        V=draw(st.integers(2, 40)),
        T=draw(st.integers(1, 8)),
        C=H * D,
        L=draw(st.integers(1, 2)),
        H=H,
        d_ff=draw(st.integers(1, 24)),
        dropout=0.0,
    )


@pytest.mark.invariant("backbone_v1.mixed_precision")
@given(cfg=configs(), half_model=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_forward_trace_backward_within_derived_bound(
    device: torch.device,
    autocast_dtypes: tuple[torch.dtype, ...],
    mixed_close: MixedClose,
    mixed_close_grads: MixedClose,
    cfg: ModelConfig,
    half_model: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    """Autocast (float32 model) or a half model: logits in the 16-bit dtype, the
    trace in float32 and equal to forward's logits, gradients in the parameters'
    dtype; all within the derived bound of the float64 model."""
    dtype = data.draw(st.sampled_from(autocast_dtypes))
    t = data.draw(st.integers(1, cfg.T))
    layer = data.draw(st.integers(0, cfg.L - 1))
    torch.manual_seed(seed)
    model = GPT(cfg).eval()
    param_dtype = dtype if half_model else torch.float32
    model.to(param_dtype)
    ref = copy.deepcopy(model).double()
    model.to(device)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, cfg.V, (2, t), generator=gen)  # (B, t)
    g = torch.randn(2, t, cfg.V, generator=gen)  # (B, t, V) upstream gradient

    with torch.autocast(device.type, dtype=dtype, enabled=not half_model):
        logits = model(x.to(device))  # (B, t, V)
        traced, trace = model.forward_with_attn_trace(x.to(device), layer, return_full_attn=True)
        grads = torch.autograd.grad((logits.float() * g.to(device)).sum(), model.parameters())
    full = trace["attn_full"]
    assert full is not None
    assert (logits.dtype, trace["attn_row"].dtype, full.dtype) == (dtype, *(torch.float32,) * 2)
    assert logits.shape == (2, t, cfg.V) and full.shape == (2, cfg.H, t, t)
    assert torch.equal(traced, logits) and torch.equal(trace["attn_row"], full[:, :, -1])
    torch.testing.assert_close(full.sum(-1), torch.ones_like(full[..., 0]))
    assert [gr.dtype for gr in grads] == [param_dtype] * len(grads)

    logits64 = ref(x)
    _, trace64 = ref.forward_with_attn_trace(x, layer, return_full_attn=True)
    grads64 = torch.autograd.grad((logits64 * g.double()).sum(), ref.parameters())
    full64 = trace64["attn_full"]
    assert full64 is not None
    per_block = 10 if half_model else 6
    n = max(cfg.C, cfg.d_ff, cfg.V, 2 * t)
    stages = cfg.L * per_block + (2 if half_model else 1)
    mixed_close(logits, logits64, dtype=dtype, stages=stages, reduction=n)
    mixed_close(full, full64, dtype=dtype, stages=layer * per_block + 2, reduction=n)
    mixed_close_grads(list(grads), list(grads64), dtype=dtype, stages=2 * stages, reduction=n)
