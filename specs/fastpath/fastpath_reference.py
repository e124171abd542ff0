"""Float64 reference of the fastpath stage's public API (maintainer-owned).

The oracle's reference worker loads this file in place of
``niels_gpt.model.fastpath`` for the calls ``reference_calls`` of
``specs/fastpath.toml`` names. It is written from that spec's API comments
(issue 5 and the 3.0 amendment), not from the stage's code. It is the fast
kernel's contract, not a fast kernel: ``sdpa_kernel`` returns what the fused
attention must return, computed explicitly in float64 whatever dtype or
autocast region it is called from:

    scores = q k^T * scale over (B, H, T, S);  query i sees keys 0 .. S - T + i
    (causality aligned bottom-right: S - T of the keys are cached);
    probabilities = softmax over the keys it sees, dropped at dropout_p;
    out = probabilities v, (B, H, T, D), rounded to q's dtype.

Everything else of a fast module is the attention stage's one attention
(RoPE, projections, dropouts, precision, the choice of when a kernel serves a
call), so ``FastCausalSelfAttention`` is ``CausalSelfAttention`` built with this
kernel, and the switches only set each attention module's ``kernel``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

__all__ = ["FastCausalSelfAttention", "sdpa_kernel", "use_explicit_attention", "use_fast_attention"]


def sdpa_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, scale: float
) -> torch.Tensor:
    """Causal attention of q ``(B, H, T, D)`` over k, v ``(B, H, S, D)``, ``S >= T``.

    Returns ``(B, H, T, D)`` in q's dtype.
    """
    t, s = q.shape[-2], k.shape[-2]
    if s < t:
        raise ValueError(f"the kernel needs at least {t} keys, got {s}")
    with torch.autocast(q.device.type, enabled=False):
        scores = (q.double() @ k.double().transpose(-2, -1)) * scale  # (B, H, T, S)
        query_at = torch.arange(s - t, s, device=q.device)[:, None]  # (T, 1): each query's key
        seen = torch.arange(s, device=q.device)[None, :] <= query_at  # (T, S)
        probs = torch.softmax(scores.masked_fill(~seen, -math.inf), dim=-1)  # (B, H, T, S)
        if dropout_p > 0:
            probs = F.dropout(probs, p=dropout_p, training=True)  # (B, H, T, S)
        out = probs @ v.double()  # (B, H, T, D)
    return out.to(q.dtype)


class FastCausalSelfAttention(CausalSelfAttention):
    """The attention stage's attention built with ``sdpa_kernel`` as its kernel."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.kernel = sdpa_kernel


def _attention(model: nn.Module) -> list[CausalSelfAttention]:
    """The attention modules of ``model``; TypeError (nothing changed) for a module
    that is not one or a subclass other than FastCausalSelfAttention."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    found = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    for m in found:
        if type(m) not in (CausalSelfAttention, FastCausalSelfAttention):
            raise TypeError(f"{type(m).__name__} is a subclass the fast path does not know")
    return found


def use_fast_attention(model: nn.Module) -> nn.Module:
    """Every attention module's kernel becomes ``sdpa_kernel``; returns ``model``."""
    for m in _attention(model):
        m.kernel = sdpa_kernel
    return model


def use_explicit_attention(model: nn.Module) -> nn.Module:
    """Every attention module's kernel becomes None; returns ``model``."""
    for m in _attention(model):
        m.kernel = None
    return model
