"""Block v0 under ``torch.autocast`` and as a half-precision module, on the session's device.

The float64 reference is the block itself, copied and converted to float64 on
the CPU (``test_block_properties.py`` proves that float64 block equal to the
pre-norm formula). The bound is the root conftest's ``mixed_close``. Rounding
stages of the output: the attention's four matmuls and the MLP's two (six);
a half-precision block also rounds its two LayerNorms and two residual adds
(ten). The probabilities pass two; a backward pass counts double.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.block_v0 import Block

MixedClose = Callable[..., None]


@st.composite
def configs(draw: st.DrawFn) -> ModelConfig:
    H = draw(st.integers(1, 3))
    D = 2 * draw(st.integers(1, 3))
    T = draw(st.integers(1, 8))
    return ModelConfig(V=8, T=T, C=H * D, H=H, d_ff=draw(st.integers(1, 24)), dropout=0.0)


def _standard_rows(z: torch.Tensor) -> torch.Tensor:
    """Rows of mean 0 and variance 1, the unit-scale input the derived bound assumes.

    LayerNorm subtracts the row mean, a cancellation that multiplies relative
    errors by ``|x| / std(x)``; rows dominated by their mean (likely at C = 2)
    would put the block outside the bound's assumptions, not outside its contract.
    """
    z = z - z.mean(-1, keepdim=True)  # (B, T, C)
    return z / z.pow(2).mean(-1, keepdim=True).sqrt().clamp_min(1e-3)  # (B, T, C)


def _run(
    block: Block, x: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
    """``(y, probs, grads of x and of every parameter)`` for the loss ``sum(y * g)``."""
    x = x.detach().requires_grad_()
    y, probs = block(x, return_attn=True)
    wrt = [x, *block.parameters()]
    grads = torch.autograd.grad((y.to(g.dtype) * g).sum(), wrt)
    return y, probs, list(grads)


@pytest.mark.invariant("block.mixed_precision")
@given(cfg=configs(), half_module=st.booleans(), seed=st.integers(0, 2**16), data=st.data())
def test_autocast_and_half_block_within_derived_bound(
    device: torch.device,
    autocast_dtypes: tuple[torch.dtype, ...],
    mixed_close: MixedClose,
    mixed_close_grads: MixedClose,
    cfg: ModelConfig,
    half_module: bool,
    seed: int,
    data: st.DataObject,
) -> None:
    """Autocast: float32 residual stream out, float32 probabilities, float32 grads.
    Half module: its own dtype out and in its grads, float32 probabilities."""
    dtype = data.draw(st.sampled_from(autocast_dtypes))
    torch.manual_seed(seed)
    block = Block(cfg).eval()
    x_dtype = dtype if half_module else torch.float32
    block.to(x_dtype)
    ref = copy.deepcopy(block).double()  # the same (rounded) weights in float64
    block.to(device)
    gen = torch.Generator().manual_seed(seed)
    x = _standard_rows(torch.randn(2, cfg.T, cfg.C, generator=gen)).to(x_dtype)  # (B, T, C)
    g = torch.randn(2, cfg.T, cfg.C, generator=gen).to(x_dtype)  # (B, T, C)

    with torch.autocast(device.type, dtype=dtype, enabled=not half_module):
        y, probs, grads = _run(block, x.to(device), g.to(device))
    assert (y.dtype, probs.dtype) == (x_dtype, torch.float32)
    assert [gr.dtype for gr in grads] == [x_dtype] * len(grads)
    assert (y.shape, probs.shape) == (x.shape, (2, cfg.H, cfg.T, cfg.T))
    torch.testing.assert_close(probs.sum(-1), torch.ones_like(probs[..., 0]))

    y64, probs64, grads64 = _run(ref, x.double(), g.double())
    n = max(cfg.C, cfg.d_ff, 2 * cfg.T)
    stages = 10 if half_module else 6
    mixed_close(y, y64, dtype=dtype, stages=stages, reduction=n)
    mixed_close(probs, probs64, dtype=dtype, stages=2, reduction=n)
    mixed_close_grads(grads, grads64, dtype=dtype, stages=2 * stages, reduction=n)
