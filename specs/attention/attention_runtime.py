"""Runtime-rule drivers of the attention stage (maintainer-owned; run by ``contracts pr``).

Each driver is called as ``driver(device, record)`` in the verdict's sandbox;
the ATen ops dispatched inside its ``with record():`` blocks are judged
against the rule that names it in ``specs/attention.toml``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from speckit import module_runtime

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache

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
            module_runtime.drive(attn, x)


def extended_calls(device: torch.device, record: Record) -> None:
    """Calls with per-row positions, a key mask and a KV cache (attention 1.1).

    A padded batch (a row that sees nothing included) in training, forward and
    backward, then prefill and one-token steps through a cache under
    ``no_grad``, with and without probabilities: the explicit core serves all
    of them, whatever kernel could serve a plain call.
    """
    torch.manual_seed(0)
    cfg = ModelConfig(V=16, T=160, C=32, H=4, d_ff=64, dropout=0.1)
    attn = CausalSelfAttention(cfg).to(device)
    B, t = 3, 150  # past one query block
    pads = torch.tensor([0, 7, t], device=device)  # (B,): the last row is all padding
    cols = torch.arange(t, device=device)  # (t,)
    mask = cols[None, :] >= pads[:, None]  # (B, t) bool, left-padded
    positions = (cols[None, :] - pads[:, None]).clamp(min=0)  # (B, t) int64
    x = torch.randn(B, t, cfg.C, device=device, requires_grad=True)  # (B, t, C)
    with record():
        attn.train()
        y, probs = attn(x, return_attn=True, positions=positions, key_mask=mask)
        (y.square().mean() + probs.sum()).backward()
    attn.eval()
    attn.kv_cache = KVCache(B, cfg.H, cfg.T, cfg.C // cfg.H, dtype=x.dtype, device=device)
    keys = torch.arange(cfg.T, device=device)[None, :] >= pads[:, None]  # (B, T) bool
    with record(), torch.no_grad():
        attn(x[:, :t], positions=positions, key_mask=mask)  # (B, t, C): the prefill
        for step in range(t, cfg.T):
            pos = (step - pads).clamp(min=0)[:, None]  # (B, 1)
            attn(x[:, :1], return_attn=step % 2 == 0, positions=pos, key_mask=keys[:, : step + 1])
    del attn.kv_cache
