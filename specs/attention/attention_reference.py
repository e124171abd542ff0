"""Float64 reference of the attention stage's public API (maintainer-owned).

The oracle's reference worker loads this file in place of
``niels_gpt.model.attention`` when the base has no attention code to compare
a PR with (the stage's first PR) and for the calls ``reference_calls`` of
``specs/attention.toml`` names (the calls 1.1 added: per-row ``positions``,
a ``key_mask``, a ``KVCache``). It is written from the spec, not from the
implementation: one full score matrix over every key the call sees, the
visibility rule as ``-inf``, softmax, and RoPE on interleaved channel pairs in
its own formula, on the sin/cos tables the contract names
(``rope.rope_cache``'s float32 values) at each query's and key's position.
Every number is computed in float64 from the given inputs and parameters,
whatever dtype or autocast region the call comes from; only the results are
rounded to the dtypes the spec promises (``y`` in the module's or autocast's
dtype, the probabilities in float32, or float64 in a float64 module). Its
``KVCache`` keeps float64 rows whatever dtype it is given, so cached calls are
judged against exact history. Parameters and ``state_dict`` keys are the
stage's (``qkv.weight``, ``proj.weight``), so the oracle loads the same weights
into both. Dropout is applied as the stage does (``nn.Dropout`` on the
probabilities and on the output); calls with dropout on compare only what
dropout does not touch.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig

__all__ = ["CausalSelfAttention", "KVCache"]


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """RoPE on ``(B, H, T, D)``: pair ``(2i, 2i+1)`` at a position turns by the angle
    whose sine and cosine are ``sin[..., i]``, ``cos[..., i]`` (``(B, 1, T, D/2)``)."""
    a, b = x[..., 0::2], x[..., 1::2]  # (B, H, T, D/2) each
    out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1)  # (B, H, T, D/2, 2)
    return out.flatten(-2)  # (B, H, T, D)


class KVCache:
    """The spec's cache: ``len()`` filled positions; rows kept in float64."""

    def __init__(
        self,
        batch_size: int,
        n_head: int,
        max_len: int,
        head_dim: int,
        *,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        for name, value in (("batch_size", batch_size), ("n_head", n_head),
                            ("max_len", max_len), ("head_dim", head_dim)):  # fmt: skip
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InputError(f"KVCache dtype must be a floating torch.dtype, got {dtype!r}")
        shape = (batch_size, n_head, max_len, head_dim)
        self.dtype = dtype
        self.keys = torch.zeros(shape, dtype=torch.float64, device=device)  # (B, H, M, D)
        self.values = torch.zeros(shape, dtype=torch.float64, device=device)  # (B, H, M, D)
        self._p = 0

    def __len__(self) -> int:
        return self._p

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._p + k.shape[2]
        self.keys[:, :, self._p : end] = k.double()  # (B, H, T, D)
        self.values[:, :, self._p : end] = v.double()  # (B, H, T, D)
        self._p = end
        return self.keys[:, :, :end], self.values[:, :, :end]  # (B, H, p+T, D) each


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
        self.kernel = None
        # The contract's tables: rope.rope_cache's float32 values (the correctly rounded
        # exact ones), which a converted module keeps. Taken from the rope stage, not
        # recomputed: a float64 recomputation rounds differently at float32 boundaries.
        sin, cos = rope.rope_cache(cfg.T, cfg.C // cfg.H, theta=cfg.rope_theta)  # (1, 1, T, D/2)
        self._tables = (sin[0, 0].double(), cos[0, 0].double())  # (T, D/2) each, float64

    def _check(self, x: Any, cache: Any, positions: Any, key_mask: Any) -> int:
        """Every condition the spec lists, before anything is written; the cache length."""
        w, cfg = self.qkv.weight, self.cfg
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != cfg.C:
            raise InputError(f"x must be (B, T, {cfg.C}), got {getattr(x, 'shape', x)}")
        if x.dtype != w.dtype or x.device != w.device:
            raise InputError(f"x must be {w.dtype} on {w.device}, got {x.dtype} on {x.device}")
        b, t, _ = x.shape
        if not 1 <= t <= cfg.T:
            raise InputError(f"T must be in [1, {cfg.T}], got {t}")
        p = 0
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise InputError(f"kv_cache must be a KVCache, got {type(cache).__name__}")
            size, heads, room, dim = cache.keys.shape
            p = len(cache)
            if size != b or (heads, dim) != (self.n_head, self.head_dim):
                raise InputError(f"the KV cache {tuple(cache.keys.shape)} does not fit x")
            if p + t > min(room, cfg.T):
                raise InputError(f"{p} cached + {t} new positions exceed {room} or {cfg.T}")
            if cache.dtype != w.dtype or cache.keys.device != w.device:
                raise InputError(f"the KV cache must be {w.dtype} on {w.device}")
        if positions is not None:
            if not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64:
                raise InputError(f"positions must be int64, got {type(positions).__name__}")
            if positions.shape != (b, t) or positions.device != x.device:
                raise InputError(f"positions must be ({b}, {t}), got {tuple(positions.shape)}")
            if int(positions.min()) < 0 or int(positions.max()) >= cfg.T:
                raise InputError(f"positions must be in [0, {cfg.T - 1}]")
        if key_mask is not None:
            if not isinstance(key_mask, torch.Tensor) or key_mask.dtype != torch.bool:
                raise InputError(f"key_mask must be bool, got {type(key_mask).__name__}")
            if key_mask.shape != (b, p + t) or key_mask.device != x.device:
                raise InputError(f"key_mask must be ({b}, {p + t}), got {tuple(key_mask.shape)}")
        return p

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: bool = False,
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        cache = getattr(self, "kv_cache", None)
        p = self._check(x, cache, positions, key_mask)
        out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        probs_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.autocast("cpu", enabled=False):
            b, t, c = x.shape
            h, d = self.n_head, self.head_dim
            qkv = x.double() @ self.qkv.weight.double().T  # (B, T, 3C)
            q, k, v = (z.reshape(b, t, h, d).transpose(1, 2) for z in torch.split(qkv, c, dim=-1))
            if positions is None:
                positions = torch.arange(p, p + t).expand(b, t)  # (B, T)
            sin, cos = (table[positions][:, None] for table in self._tables)  # (B, 1, T, D/2)
            q, k = _rotate(q, sin, cos), _rotate(k, sin, cos)  # (B, H, T, D) each
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H, p+T, D) each, float64
            m = p + t
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, m)
            query_at = torch.arange(p, m)[:, None]  # (T, 1): each query's column
            seen = torch.arange(m)[None, :] <= query_at  # (T, m)
            seen = seen[None, None] if key_mask is None else seen & key_mask[:, None, None, :]
            probs = torch.softmax(scores.masked_fill(~seen, -math.inf), dim=-1)  # (B, H, T, m)
            probs = torch.where(seen.any(-1, keepdim=True), probs, 0.0)  # no key: a zero row
            mixed = self.attn_dropout(probs) @ v  # (B, H, T, D)
            y = mixed.transpose(1, 2).reshape(b, t, c) @ self.proj.weight.double().T  # (B, T, C)
            y = self.resid_dropout(y)  # (B, T, C)
        out: torch.Tensor = y.to(out_dtype)  # (B, T, C)
        if return_attn:
            return out, probs.to(probs_dtype)
        return out
