"""Runtime-rule drivers of the attention stage (maintainer-owned; run by ``contracts pr``).

Each driver is called as ``driver(device, record)`` in the verdict's sandbox;
the ATen ops dispatched inside its ``with record():`` blocks are judged
against the rule that names it in ``specs/attention.toml``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

Record = Callable[[], AbstractContextManager[None]]


def forward_backward(device: torch.device, record: Record) -> None:
    """Train and eval forwards (with and without probabilities), backward, and inference.

    Inference (eval, no probabilities, under no_grad and inference_mode) is
    where a fused kernel is cheapest to slip in, so it is driven too.
    """
    torch.manual_seed(0)
    cfg = ModelConfig(V=16, T=160, C=32, H=4, d_ff=64, dropout=0.1)
    attn = CausalSelfAttention(cfg).to(device)
    for t in (7, 160):  # one query block, and more than one (QUERY_BLOCK is 128)
        x = torch.randn(2, t, cfg.C, device=device, requires_grad=True)  # (B, T, C)
        with record():
            attn.train()
            y = attn(x)  # (B, T, C)
            y.square().mean().backward()
            attn.eval()
            y, probs = attn(x, return_attn=True)  # (B, T, C), (B, H, T, T)
            (y.sum() + probs.sum()).backward()
            with torch.no_grad():
                attn(x)  # (B, T, C)
            with torch.inference_mode():
                attn(x.detach())  # (B, T, C)
