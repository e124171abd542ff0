"""Float64 reference of grouped-query attention (maintainer-owned), from the definition.

The oracle's reference worker loads this file in place of
``niels_gpt.model.attention`` and ``niels_gpt.model.gqa``. Grouped-query
attention is multi-head attention whose ``H_kv`` key/value heads are each
repeated ``G = H / H_kv`` times (``repeat_interleave``: query head ``h``
reads K/V head ``h // G``), so this module computes exactly that: the fused
projection split ``C | H_kv D | H_kv D``, RoPE on interleaved pairs at each
position (rope_cache's float32 tables), K/V repeated, one full score matrix,
``-inf`` where not visible, softmax, a zero row where no key is seen. Every
number is float64; only results are rounded to the promised dtypes.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig

__all__ = ["CausalSelfAttention", "KVCache", "cache_bytes_per_token", "kv_head_of"]


def cache_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return cfg.L * 2 * cfg.kv_heads * cfg.head_dim * dtype.itemsize


def kv_head_of(cfg: ModelConfig, head: int) -> int:
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < cfg.H:
        raise InputError(f"head must be an int in [0, {cfg.H}), got {head!r}")
    return head // (cfg.H // cfg.kv_heads)


def _rotate(x: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """Pair ``(2i, 2i+1)`` of ``(B, h, T, D)`` turned by ``sin``/``cos`` ``(B, 1, T, D/2)``."""
    a, b = x[..., 0::2], x[..., 1::2]  # (B, h, T, D/2) each
    return torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)  # (B, h, T, D)


class KVCache:
    """``len()`` filled positions; rows ``(B, H_kv, max_len, D)`` kept in float64."""

    def __init__(self, batch_size: int, n_head: int, max_len: int, head_dim: int, *,
                 dtype: torch.dtype, device: torch.device) -> None:  # fmt: skip
        sizes = (batch_size, n_head, max_len, head_dim)
        if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in sizes):
            raise InputError(f"KVCache sizes must be ints >= 1, got {sizes}")
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InputError(f"KVCache dtype must be a floating torch.dtype, got {dtype!r}")
        self.dtype, self._p = dtype, 0
        self.keys = torch.zeros(sizes, dtype=torch.float64, device=device)  # (B, H_kv, M, D)
        self.values = torch.zeros(sizes, dtype=torch.float64, device=device)  # (B, H_kv, M, D)

    def __len__(self) -> int:
        return self._p

    def append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._p + k.shape[2]
        self.keys[:, :, self._p : end] = k.double()  # (B, H_kv, T, D)
        self.values[:, :, self._p : end] = v.double()  # (B, H_kv, T, D)
        self._p = end
        return self.keys[:, :, :end], self.values[:, :, :end]  # (B, H_kv, p+T, D) each


class CausalSelfAttention(nn.Module):
    """The definition of grouped-query attention, computed in float64."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg, self.n_head, self.n_kv_head = cfg, cfg.H, cfg.kv_heads
        self.head_dim = cfg.head_dim
        self.qkv = nn.Linear(cfg.C, cfg.C + 2 * cfg.kv_heads * cfg.head_dim, bias=False)
        self.proj = nn.Linear(cfg.C, cfg.C, bias=False)
        self.attn_dropout, self.resid_dropout = nn.Dropout(cfg.dropout), nn.Dropout(cfg.dropout)
        self.kernel = None
        sin, cos = rope.rope_cache(cfg.T, cfg.head_dim, theta=cfg.rope_theta)  # (1, 1, T, D/2)
        self._tables = (sin[0, 0].double(), cos[0, 0].double())  # (T, D/2) each

    def _check(self, x: Any, cache: Any, positions: Any, key_mask: Any) -> int:
        w, cfg = self.qkv.weight, self.cfg
        if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != cfg.C:
            raise InputError(f"x must be (B, T, {cfg.C}), got {getattr(x, 'shape', x)}")
        if x.dtype != w.dtype or x.device != w.device or not 1 <= x.shape[1] <= cfg.T:
            raise InputError(f"x must be {w.dtype} on {w.device}, 1 <= T <= {cfg.T}")
        (b, t, _), p = x.shape, 0
        if cache is not None:
            p = len(cache)
            size, heads, room, dim = cache.keys.shape
            if (size, heads, dim) != (b, self.n_kv_head, self.head_dim) or p + t > min(room, cfg.T):
                raise InputError(f"the KV cache {tuple(cache.keys.shape)} does not fit x")
        if positions is not None and (
            positions.dtype != torch.int64 or positions.shape != (b, t)
            or int(positions.min()) < 0 or int(positions.max()) >= cfg.T
        ):  # fmt: skip
            raise InputError(f"positions must be ({b}, {t}) int64 in [0, {cfg.T})")
        if key_mask is not None and (key_mask.dtype != torch.bool or key_mask.shape != (b, p + t)):
            raise InputError(f"key_mask must be ({b}, {p + t}) bool")
        return p

    def forward(self, x: torch.Tensor, *, return_attn: bool = False,
                positions: torch.Tensor | None = None,
                key_mask: torch.Tensor | None = None) -> Any:  # fmt: skip
        cache = getattr(self, "kv_cache", None)
        p = self._check(x, cache, positions, key_mask)
        out_dtype = torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else x.dtype
        probs_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.autocast("cpu", enabled=False):
            (b, t, c), h, hk, d = x.shape, self.n_head, self.n_kv_head, self.head_dim
            qkv = x.double() @ self.qkv.weight.double().T  # (B, T, C + 2 H_kv D)
            q, k, v = torch.split(qkv, [c, hk * d, hk * d], dim=-1)  # (B, T, *) each
            q = q.reshape(b, t, h, d).transpose(1, 2)  # (B, H, T, D)
            k, v = (z.reshape(b, t, hk, d).transpose(1, 2) for z in (k, v))  # (B, H_kv, T, D)
            if positions is None:
                positions = torch.arange(p, p + t).expand(b, t)  # (B, T)
            sin, cos = (tab[positions][:, None] for tab in self._tables)  # (B, 1, T, D/2)
            q, k = _rotate(q, sin, cos), _rotate(k, sin, cos)  # (B, H, T, D), (B, H_kv, T, D)
            if cache is not None:
                k, v = cache.append(k, v)  # (B, H_kv, p+T, D) each
            k, v = k.repeat_interleave(h // hk, 1), v.repeat_interleave(h // hk, 1)  # (B, H, m, D)
            m = p + t
            scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (B, H, T, m)
            seen = torch.arange(m)[None, :] <= torch.arange(p, m)[:, None]  # (T, m)
            seen = seen[None, None] if key_mask is None else seen & key_mask[:, None, None, :]
            probs = torch.softmax(scores.masked_fill(~seen, -math.inf), dim=-1)  # (B, H, T, m)
            probs = torch.where(seen.any(-1, keepdim=True), probs, 0.0)  # (B, H, T, m)
            mixed = self.attn_dropout(probs) @ v  # (B, H, T, D)
            y = mixed.transpose(1, 2).reshape(b, t, c) @ self.proj.weight.double().T  # (B, T, C)
            y = self.resid_dropout(y)  # (B, T, C)
        out = y.to(out_dtype)  # (B, T, C)
        return (out, probs.to(probs_dtype)) if return_attn else out
