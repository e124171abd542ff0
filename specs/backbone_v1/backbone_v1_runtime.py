"""Runtime-rule drivers of the backbone v1 stage (maintainer-owned; run by ``contracts pr``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
import torch.nn.functional as F

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT

Record = Callable[[], AbstractContextManager[None]]


def forward_backward(device: torch.device, record: Record) -> None:
    """GPT v1: a training step's forward and backward, and the traced forward."""
    torch.manual_seed(0)
    cfg = ModelConfig(V=32, T=16, C=32, L=2, H=4, d_ff=64, dropout=0.1)
    model = GPT(cfg).to(device)
    ids = torch.randint(0, cfg.V, (2, 12), device=device)  # (B, t)
    with record():
        model.train()
        logits = model(ids)  # (B, t, V)
        torch.autograd.backward(F.cross_entropy(logits.flatten(0, 1), ids.flatten()))
        model.eval()
        logits, trace = model.forward_with_attn_trace(ids, trace_layer=1, return_full_attn=True)
        assert trace["attn_full"] is not None
        torch.autograd.backward(logits.sum() + trace["attn_full"].sum())
        with torch.no_grad():
            model(ids)  # (B, t, V)
        with torch.inference_mode():
            model(ids)  # (B, t, V)
