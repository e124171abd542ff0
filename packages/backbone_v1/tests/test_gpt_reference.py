"""GPT v1 end to end against a reference assembled from its parts.

Added because a mutant that dropped the final RMSNorm survived every other
test: shapes, causality and trace checks all hold without it. The reference
below rebuilds the head from the formulas (RMSNorm, then the embedding matrix
transposed) and uses each block only as a black box checked in its own test.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT

Tol = Callable[[torch.dtype], dict[str, float]]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * weight  # (..., C)


@pytest.mark.invariant("backbone_v1.matches_reference")
@given(
    H=st.integers(1, 3),
    half_d=st.integers(1, 3),
    L=st.integers(1, 3),
    t=st.integers(1, 8),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_logits_are_final_norm_then_tied_head(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    H: int,
    half_d: int,
    L: int,
    t: int,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    cfg = ModelConfig(V=37, T=8, C=H * 2 * half_d, L=L, H=H, d_ff=12, dropout=0.0)
    torch.manual_seed(seed)
    model = GPT(cfg)
    with torch.no_grad():  # a non-trivial final norm weight, so its absence shows
        model.ln_f.weight.copy_(torch.rand(cfg.C) + 0.5)
    model.to(device=device, dtype=dtype).eval()
    x = torch.randint(0, cfg.V, (2, t), generator=torch.Generator().manual_seed(seed))
    x = x.to(device)
    logits = model(x)  # (2, t, V)
    h = model.tok_emb.weight[x]  # (2, t, C)
    for block in model.blocks:
        h = block(h)  # (2, t, C)
    expected = _rms_norm(h, model.ln_f.weight) @ model.tok_emb.weight.T  # (2, t, V)
    torch.testing.assert_close(logits, expected, **tol(dtype))
