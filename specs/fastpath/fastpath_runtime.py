"""Runtime-rule drivers of the fastpath stage (maintainer-owned; run by ``contracts pr``).

Each driver is called as ``driver(device, record)`` in the verdict's sandbox;
the ATen ops dispatched inside its ``with record():`` blocks are judged
against the rule that names it in ``specs/fastpath.toml``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import KVCache
from niels_gpt.model.fastpath import FastCausalSelfAttention

Record = Callable[[], AbstractContextManager[None]]


def explicit_calls(device: torch.device, record: Record) -> None:
    """A fast module's calls the SDPA kernel must not serve, forward and backward.

    With probabilities (the trace) and with a key mask (a padded batch), also
    through a KV cache (a prefill and one-token steps): the attention stage
    runs its explicit core for all of them, whatever the module's kernel.
    (3.0: a cached call without either may reach SDPA, so none is recorded.)
    """
    torch.manual_seed(0)
    cfg = ModelConfig(V=16, T=40, C=32, H=4, d_ff=64, dropout=0.1)
    attn = FastCausalSelfAttention(cfg).to(device)
    x = torch.randn(2, 24, cfg.C, device=device, requires_grad=True)  # (B, t, C)
    mask = torch.arange(24, device=device)[None, :] >= torch.tensor([[0], [5]], device=device)
    with record():
        attn.train()
        y, probs = attn(x, return_attn=True)  # (B, t, C), (B, H, t, t)
        (y.square().mean() + probs.sum()).backward()
        attn(x, key_mask=mask).square().mean().backward()  # (B, t, C)
    attn.eval()
    attn.kv_cache = KVCache(2, cfg.H, cfg.T, cfg.C // cfg.H, dtype=x.dtype, device=device)
    keys = torch.arange(cfg.T, device=device)[None, :] >= torch.tensor([[0], [5]], device=device)
    with record(), torch.no_grad():
        attn(x, key_mask=mask)  # (B, t, C): a padded prefill
        for step in range(24, 28):
            if step % 2:
                attn(x[:, :1], key_mask=keys[:, : step + 1])  # (B, 1, C): a padded step
            else:
                attn(x[:, :1], return_attn=True)  # (B, 1, C), (B, H, 1, step + 1)
    del attn.kv_cache
