"""Independent formulations the explicit path is measured against (bench code only).

- RoPE by complex multiplication, and by ``rotate_half`` on half-split channels;
- a textbook attention core and RoPE (what the stages looked like before tuning);
- ``NanoGPT``: a nanoGPT-style model of exactly the GPT v1 size (RoPE, RMSNorm,
  SwiGLU, tied head) that uses ``scaled_dot_product_attention`` and
  ``nn.RMSNorm``, i.e. what plain PyTorch offers for speed.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from niels_gpt.config import ModelConfig


def complex_rope_table(sin: torch.Tensor, cos: torch.Tensor) -> torch.Tensor:
    """``cos + i sin`` as a complex tensor ``(1, 1, T, D/2)`` (not on MPS)."""
    return torch.complex(cos, sin)


def rope_complex(
    q: torch.Tensor, k: torch.Tensor, table: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pair ``(x[2i], x[2i+1])`` as one complex number, multiply by ``e^{i angle}``."""
    t = q.shape[-2]
    rot = table[:, :, :t]  # (1, 1, t, D/2) complex

    def one(x: torch.Tensor) -> torch.Tensor:
        z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))  # (B, H, t, D/2) complex
        return torch.view_as_real(z * rot).flatten(-2)  # (B, H, t, D)

    return one(q), one(k)


def to_half_split(x: torch.Tensor) -> torch.Tensor:
    """Interleaved channels ``(a0, b0, a1, b1, ...)`` to halves ``(a0, a1, ..., b0, b1, ...)``."""
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def half_split_tables(sin: torch.Tensor, cos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat((sin, sin), dim=-1), torch.cat((cos, cos), dim=-1)  # (1, 1, T, D) each


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


def rope_half_split(
    q: torch.Tensor, k: torch.Tensor, sin_h: torch.Tensor, cos_h: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The Llama/NeoX layout: q, k already in half-split channel order (weights permuted)."""
    t = q.shape[-2]
    s, c = sin_h[:, :, :t], cos_h[:, :, :t]
    return q * c + rotate_half(q) * s, k * c + rotate_half(k) * s


def rope_textbook(
    q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Reshape to pairs, rotate, stack back: the untuned stage-003 code."""
    t = q.shape[-2]
    s, c = sin[:, :, :t], cos[:, :, :t]

    def one(x: torch.Tensor) -> torch.Tensor:
        a, b = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
        return torch.stack((a * c - b * s, a * s + b * c), dim=-1).flatten(-2)

    return one(q), one(k)


def attention_textbook(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Full ``(T, T)`` scores, mask, softmax, ``@ v``: the untuned stage-000 core."""
    T, D = q.shape[-2], q.shape[-1]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1) @ v


class _Attention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_head = cfg.H
        self.c_attn = nn.Linear(cfg.C, 3 * cfg.C, bias=False)
        self.c_proj = nn.Linear(cfg.C, cfg.C, bias=False)
        self.dropout = cfg.dropout
        self.resid_dropout = nn.Dropout(cfg.dropout)
        D = cfg.C // cfg.H
        inv = cfg.rope_theta ** (-torch.arange(0, D, 2, dtype=torch.float64) / D)
        ang = torch.outer(torch.arange(cfg.T, dtype=torch.float64), inv)
        self.register_buffer("sin", torch.cat((ang.sin(), ang.sin()), -1).float(), persistent=False)
        self.register_buffer("cos", torch.cat((ang.cos(), ang.cos()), -1).float(), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        s, c = self.sin[:T], self.cos[:T]  # type: ignore[index]
        q = q * c + rotate_half(q) * s
        k = k * c + rotate_half(k) * s
        y = F.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout if self.training else 0.0, is_causal=True
        )
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        out: torch.Tensor = self.resid_dropout(self.c_proj(y))
        return out


class _MLP(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.c_fc = nn.Linear(cfg.C, 2 * cfg.d_ff)  # value and gate in one matmul
        self.c_proj = nn.Linear(cfg.d_ff, cfg.C)
        self.dropout = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, g = self.c_fc(x).chunk(2, dim=-1)
        out: torch.Tensor = self.dropout(self.c_proj(F.silu(g) * a))
        return out


class _Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln_1 = nn.RMSNorm(cfg.C, eps=1e-5)
        self.attn = _Attention(cfg)
        self.ln_2 = nn.RMSNorm(cfg.C, eps=1e-5)
        self.mlp = _MLP(cfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        out: torch.Tensor = x + self.mlp(self.ln_2(x))
        return out


class NanoGPT(nn.Module):
    """nanoGPT-style model with the GPT v1 parameter count and FLOPs, using SDPA."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.wte = nn.Embedding(cfg.V, cfg.C)
        self.drop = nn.Dropout(cfg.dropout)
        self.h = nn.ModuleList([_Block(cfg) for _ in range(cfg.L)])
        self.ln_f = nn.RMSNorm(cfg.C, eps=1e-5)
        self.lm_head = nn.Linear(cfg.C, cfg.V, bias=False)
        self.wte.weight = self.lm_head.weight
        for name, p in self.named_parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)
            elif name.endswith("bias"):
                nn.init.zeros_(p)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.drop(self.wte(idx))
        for block in self.h:
            x = block(x)
        logits: torch.Tensor = self.lm_head(self.ln_f(x))
        return logits
