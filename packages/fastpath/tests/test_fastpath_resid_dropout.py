"""The fast path keeps the explicit path's residual dropout.

Added because a mutant that returned ``proj(out)`` without ``resid_dropout``
survived the fastpath tests: they compare eval outputs and the SDPA dropout
rate, and neither sees the residual dropout.
"""

from __future__ import annotations

import pytest
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.fastpath import FastCausalSelfAttention


@pytest.mark.invariant("fastpath.resid_dropout")
def test_train_mode_output_goes_through_resid_dropout(device: torch.device) -> None:
    cfg = ModelConfig(V=8, T=16, C=32, H=4, d_ff=8, dropout=0.5)
    torch.manual_seed(0)
    attn = FastCausalSelfAttention(cfg).to(device)
    x = torch.randn(2, cfg.T, cfg.C, device=device)  # (B, T, C)
    y_eval = attn.eval()(x)
    attn.train()
    attn.attn_dropout.p = 0.0  # only the residual dropout is live
    calls: list[tuple[torch.Tensor, torch.Tensor]] = []
    handle = attn.resid_dropout.register_forward_hook(lambda m, i, o: calls.append((i[0], o)))
    y = attn(x)
    handle.remove()
    assert len(calls) == 1, f"resid_dropout must run once per forward, ran {len(calls)}"
    before, after = calls[0]
    torch.testing.assert_close(before, y_eval)  # its input is the projection output
    assert torch.equal(after, y)  # and it is the last step
    assert (y == 0).any() and not torch.allclose(y, y_eval)
