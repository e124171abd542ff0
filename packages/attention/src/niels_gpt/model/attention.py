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

    #: Query rows scored per block in the attention core (see ``_attend``).
    QUERY_BLOCK: int = 128

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

        q, k, v = self.qkv(x).split(C, dim=-1)  # (B, T, C) each, views of one buffer
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D) strided view
        k = k.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D) strided view
        v = v.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D) strided view
        q, k = rope.apply_rope(q, k, self.rope_sin, self.rope_cos)  # (B, H, T, D) each
        out, probs = self._attend(q, k, v, return_attn=return_attn)  # (B, T, H, D)
        y: torch.Tensor = self.resid_dropout(self.proj(out.view(B, T, C)))  # (B, T, C)
        if probs is not None:  # exactly when return_attn is true
            return y, probs
        return y

    def _attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, return_attn: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The attention core: ``softmax(mask(q k^T / sqrt(D))) @ v``, dropout on the probs.

        Queries go in blocks of ``QUERY_BLOCK`` rows. A block of rows ``[r0, r1)``
        scores only keys ``[0, r1)``: every later key is masked for all of those
        rows, so its probability is exactly zero and skipping it changes nothing
        but the work (about half the matmul and softmax work at long ``T``). Each
        block still runs the full recipe: scale, ``masked_fill`` with
        ``finfo.min`` where ``~mask`` (a view of the buffer), softmax over the
        last dim, ``attn_dropout`` on the probabilities, then ``@ v``. With
        ``T <= QUERY_BLOCK`` there is one block and this is the textbook code.

        Returns ``(out, probs)``: ``out`` is ``(B, T, H, D)`` contiguous (so the
        head merge is a view); ``probs`` is the ``(B, H, T, T)`` pre-dropout
        softmax when ``return_attn`` is true (zeros above the diagonal, as the
        softmax gives), else ``None``.
        """
        B, H, T, D = q.shape
        scale = 1.0 / math.sqrt(D)
        v = v.contiguous()  # (B, H, T, D); once here, not once per block inside matmul
        out = q.new_empty(B, T, H, D)  # (B, T, H, D), filled block by block
        probs_full: torch.Tensor | None = None
        if return_attn and T > self.QUERY_BLOCK:
            probs_full = q.new_zeros(B, H, T, T)  # (B, H, T, T)
        for r0 in range(0, T, self.QUERY_BLOCK):
            r1 = min(T, r0 + self.QUERY_BLOCK)
            scores = q[:, :, r0:r1] @ k[:, :, :r1].transpose(-2, -1)  # (B, H, R, r1)
            scores = scores.mul_(scale)  # (B, H, R, r1), in place: matmul keeps no output
            visible = self.mask[:, :, r0:r1, :r1]  # (1, 1, R, r1) view of the buffer
            scores = scores.masked_fill_(~visible, torch.finfo(scores.dtype).min)  # (B, H, R, r1)
            probs = torch.softmax(scores, dim=-1)  # (B, H, R, r1)
            block = self.attn_dropout(probs) @ v[:, :, :r1]  # (B, H, R, D)
            out[:, r0:r1] = block.transpose(1, 2)  # (B, R, H, D) into (B, T, H, D)
            if probs_full is not None:
                probs_full[:, :, r0:r1, :r1] = probs  # (B, H, R, r1) into (B, H, T, T)
        if not return_attn:
            return out, None
        return out, (probs if probs_full is None else probs_full)  # (B, H, T, T)
