"""Causal multi-head self-attention with rotary position embeddings.

Shape notation::

    B: batch, T: sequence length (<= cfg.T), C: width, H: heads, D = C // H

Written from scratch on purpose: no ``scaled_dot_product_attention``, so the
attention probabilities are there to return and to test. RoPE is reached
through the module object (``rope.apply_rope``) so tests can monkeypatch it.
"""

from __future__ import annotations

import math

import torch
from torch import nn

import niels_gpt.model.rope as rope
from niels_gpt.checks import check_features, check_length, check_like
from niels_gpt.config import ModelConfig

__all__ = ["CausalSelfAttention"]


class CausalSelfAttention(nn.Module):
    """Fused-QKV causal self-attention; RoPE on q and k.

    Buffers (all non-persistent, so ``state_dict`` holds only weights, and
    all moved by ``.to()``):

    - ``rope_sin``, ``rope_cos``: ``(1, 1, cfg.T, D // 2)`` float32 RoPE tables.
    - ``mask``: ``(1, 1, cfg.T, cfg.T)`` bool, lower triangular (True = visible).

    Dropout: ``attn_dropout`` on the probabilities after softmax,
    ``resid_dropout`` after the output projection. Call ``eval()`` to disable.
    """

    rope_sin: torch.Tensor
    rope_cos: torch.Tensor
    mask: torch.Tensor

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_head = cfg.H
        self.head_dim = cfg.C // cfg.H
        self.qkv = nn.Linear(cfg.C, 3 * cfg.C, bias=False)
        self.proj = nn.Linear(cfg.C, cfg.C, bias=False)
        self.attn_dropout = nn.Dropout(cfg.dropout)
        self.resid_dropout = nn.Dropout(cfg.dropout)

        sin, cos = rope.rope_cache(
            cfg.T, self.head_dim, theta=cfg.rope_theta, device="cpu", dtype=torch.float32
        )  # (1, 1, T, D/2) each
        self.register_buffer("rope_sin", sin, persistent=False)
        self.register_buffer("rope_cos", cos, persistent=False)
        mask = torch.tril(torch.ones(cfg.T, cfg.T, dtype=torch.bool))  # (T, T)
        mask = mask.unsqueeze(0).unsqueeze(0)  # (1, 1, T, T)
        self.register_buffer("mask", mask, persistent=False)

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend causally over ``x``.

        Args:
            x: ``(B, T, C)`` with ``1 <= T <= cfg.T``, on the module's device
                and in its dtype (float32 unless the module was converted).
            return_attn: also return the attention probabilities.

        Returns:
            ``y`` of shape ``(B, T, C)``; with ``return_attn=True`` the pair
            ``(y, attn)`` where ``attn`` is ``(B, H, T, T)``: the softmax output
            *before* attention dropout.

        Raises:
            InputError (an AssertionError): wrong rank or width, ``T > cfg.T``,
                or a dtype/device that differs from the module's.
        """
        check_features(x, "x", ndim=3, last=self.cfg.C)
        check_like(x, "x", self.qkv.weight, "attention")
        B, T, C = x.shape
        check_length(T, self.cfg.T)
        H, D = self.n_head, self.head_dim

        q, k, v = self.qkv(x).split(C, dim=-1)  # (B, T, C) each
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        q, k = rope.apply_rope(q, k, self.rope_sin, self.rope_cos)  # (B, H, T, D) each

        scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))  # (B, H, T, T)
        visible = self.mask[:, :, :T, :T]  # (1, 1, T, T)
        scores = scores.masked_fill(~visible, torch.finfo(scores.dtype).min)  # (B, H, T, T)
        probs = torch.softmax(scores, dim=-1)  # (B, H, T, T)
        out = self.attn_dropout(probs) @ v  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        y: torch.Tensor = self.resid_dropout(self.proj(out))  # (B, T, C)
        if return_attn:
            return y, probs
        return y
