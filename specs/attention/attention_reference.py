"""Float64 reference of the attention stage's public API (maintainer-owned).

The oracle's reference worker loads this file in place of
``niels_gpt.model.attention`` when the base has no attention code to compare
a PR with (the stage's first PR) and for the calls ``reference_calls`` of
``specs/attention.toml`` names. It is written from the spec, not from the
implementation: one full score matrix, the causal mask as ``-inf``, softmax,
and RoPE on interleaved channel pairs in its own formula, on the sin/cos
tables the contract names (``rope.rope_cache``'s float32 values). Every number is
computed in float64 from the given inputs and parameters, whatever dtype or
autocast region the call comes from; only the results are rounded to the
dtypes the spec promises (``y`` in the module's or autocast's dtype, the
probabilities in float32, or float64 in a float64 module). Parameters and
``state_dict`` keys are the stage's (``qkv.weight``, ``proj.weight``), so the
oracle loads the same weights into both. Dropout is applied as the stage
does (``nn.Dropout`` on the probabilities and on the output); calls with
dropout on compare only what dropout does not touch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig

__all__ = ["CausalSelfAttention"]


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """RoPE on ``(B, H, T, D)``: pair ``(2i, 2i+1)`` at position ``p`` turns by the angle
    whose sine and cosine are ``sin[p, i]``, ``cos[p, i]`` (``(T, D/2)``)."""
    a, b = x[..., 0::2], x[..., 1::2]  # (B, H, T, D/2) each
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)  # (B, H, T, D/2, 2)
    return out.flatten(-2)  # (B, H, T, D)


class CausalSelfAttention(nn.Module):
    """The spec's attention, computed in float64."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_head = cfg.H
        self.head_dim = cfg.C // cfg.H
        self.qkv = nn.Linear(cfg.C, 3 * cfg.C, bias=False)
        self.proj = nn.Linear(cfg.C, cfg.C, bias=False)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)
        # The contract's tables: rope.rope_cache's float32 values (the correctly rounded
        # exact ones), which a converted module keeps. Taken from the rope stage, not
        # recomputed: a float64 recomputation rounds differently at float32 boundaries.
        sin, cos = rope.rope_cache(cfg.T, cfg.C // cfg.H, theta=cfg.rope_theta)  # (1, 1, T, D/2)
        self._tables = (sin[0, 0].double(), cos[0, 0].double())  # (T, D/2) each, float64

    def _check(self, x: Any) -> None:
        w = self.qkv.weight
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != self.cfg.C:
            raise InputError(f"x must be (B, T, {self.cfg.C}), got {getattr(x, 'shape', x)}")
        if x.dtype != w.dtype or x.device != w.device:
            raise InputError(f"x must be {w.dtype} on {w.device}, got {x.dtype} on {x.device}")
        if not 1 <= x.shape[1] <= self.cfg.T:
            raise InputError(f"T must be in [1, {self.cfg.T}], got {x.shape[1]}")

    def forward(
        self, x: torch.Tensor, *, return_attn: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        self._check(x)
        out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        probs_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.autocast("cpu", enabled=False):
            b, t, c = x.shape
            t_len = t
            h, d = self.n_head, self.head_dim
            qkv = x.double() @ self.qkv.weight.double().T  # (B, T, 3C)
            q, k, v = (z.reshape(b, t, h, d).transpose(1, 2) for z in torch.split(qkv, c, dim=-1))
            sin, cos = (table[:t_len] for table in self._tables)  # (T, D/2) each
            q = _rotate(q, sin, cos)  # (B, H, T, D)
            k = _rotate(k, sin, cos)  # (B, H, T, D)
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, T)
            future = torch.ones(t, t, dtype=torch.bool).triu(1)  # (T, T)
            probs = torch.softmax(scores.masked_fill(future, -math.inf), dim=-1)  # (B, H, T, T)
            mixed = self.attn_dropout(probs) @ v  # (B, H, T, D)
            y = mixed.transpose(1, 2).reshape(b, t, c) @ self.proj.weight.double().T  # (B, T, C)
            y = self.resid_dropout(y)  # (B, T, C)
        out: torch.Tensor = y.to(out_dtype)  # (B, T, C)
        if return_attn:
            return out, probs.to(probs_dtype)
        return out
