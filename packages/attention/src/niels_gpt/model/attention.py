"""Causal multi-head self-attention with rotary position embeddings.

Shape notation::

    B: batch, T: sequence length (<= cfg.T), C: width, H: heads, D = C // H

Written from scratch on purpose: no ``scaled_dot_product_attention``, so the
attention probabilities are there to return and to test. RoPE is reached
through the module object (``rope.apply_rope``) so tests can monkeypatch it.

Mixed precision (``torch.autocast``, or a module converted to bfloat16/float16)
-------------------------------------------------------------------------------
``apply_rope`` casts nothing and rejects tables of another dtype than ``q``, so
the dtypes are settled here, in two places:

- RoPE rotates in float32 (float64 in a float64 module): ``q``/``k`` and the
  tables go to ``_rope_dtype(...)``, the widest of the activations', the tables'
  and float32, and the rotated ``q``/``k`` come back to the activation dtype
  (that of ``v``) for the score matmul. Each rotated value is then the exact
  rotation of the rounded ``q``/``k`` rounded once, where handing
  ``apply_rope`` tables cast down to bfloat16 rounds the tables, both products
  and their sum. It was also the faster choice where it was measured
  (``python -m benchmarks.rope_autocast``, also a section of ``nox -s bench``:
  q and k of (8, 8, 1024, 64) from a bfloat16-autocast projection; 2-core AMD
  EPYC without bfloat16 instructions, torch 2.13, a loaded machine: forward
  73 ms in float32 against 244 ms with bfloat16 tables, forward + backward
  192 ms against 719 ms; largest error 0.50 against 1.59 bfloat16 ulps of the
  pair length). CUDA and MPS timings of the same script are still to be taken.
- Scores are scaled, masked and soft-maxed in float32 (float64 in a float64
  module), whatever the matmul that produced them ran in; the probabilities
  are returned in that dtype (the float32 trace of seed 004) and are cast to
  the activation dtype only as the operand of ``probs @ v``.

Everything else follows autocast: the projections and both attention matmuls
run in the autocast dtype, and so does the output ``y``.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch
from torch import nn

import niels_gpt.model.rope as rope
from niels_gpt.checks import check_features, check_length, check_like
from niels_gpt.config import ModelConfig

__all__ = ["CausalSelfAttention"]


def _rope_dtype(activation: torch.dtype, table: torch.dtype) -> torch.dtype:
    """The dtype RoPE rotates in: the widest of the activations', the tables' and float32.

    float32 for float32, bfloat16 and float16 activations (autocast or a half
    module), float64 in a float64 module.
    """
    return torch.promote_types(torch.promote_types(activation, table), torch.float32)


class CausalSelfAttention(nn.Module):
    """Fused-QKV causal self-attention; RoPE on q and k.

    Buffers (all non-persistent, so ``state_dict`` holds only weights, and
    all moved by ``.to()``):

    - ``rope_sin``, ``rope_cos``: ``(1, 1, cfg.T, D // 2)`` RoPE tables, float32
      until the module is converted to another dtype.
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

    # Typed views of the one forward below: the flag decides the return type.
    @overload
    def forward(self, x: torch.Tensor, *, return_attn: Literal[False] = False) -> torch.Tensor: ...
    @overload
    def forward(
        self, x: torch.Tensor, *, return_attn: Literal[True]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def forward(
        self, x: torch.Tensor, *, return_attn: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

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
            ``y`` of shape ``(B, T, C)`` in the module's dtype, or in the
            autocast dtype under ``torch.autocast``; with ``return_attn=True``
            the pair ``(y, attn)`` where ``attn`` is ``(B, H, T, T)``: the
            softmax output *before* attention dropout, in float32 (float64 in
            a float64 module), under autocast too.

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
        q_rot, k_rot = rope.apply_rope(*self._rope_operands(q, k))  # (B, H, T, D), float32+
        q, k = q_rot.to(v.dtype), k_rot.to(v.dtype)  # (B, H, T, D) in the activation dtype
        out, probs = self._attend(q, k, v, return_attn=return_attn)  # (B, T, H, D)
        y: torch.Tensor = self.resid_dropout(self.proj(out.view(B, T, C)))  # (B, T, C)
        if probs is not None:  # exactly when return_attn is true
            return y, probs
        return y

    def _rope_operands(
        self, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q, k, sin, cos)`` for ``rope.apply_rope``, all in ``_rope_dtype``.

        ``q``, ``k``: ``(B, H, T, D)``. Every ``.to`` is a no-op in a float32 or
        float64 module outside autocast.
        """
        work = _rope_dtype(q.dtype, self.rope_sin.dtype)
        return (
            q.to(work),  # (B, H, T, D)
            k.to(work),  # (B, H, T, D)
            self.rope_sin.to(work),  # (1, 1, cfg.T, D/2)
            self.rope_cos.to(work),  # (1, 1, cfg.T, D/2)
        )

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

        Scale, mask and softmax run in ``probs_dtype`` (float32, or float64 in a
        float64 module) whatever dtype the score matmul ran in; the dropped-out
        probabilities meet ``v`` in ``v``'s dtype.

        Returns ``(out, probs)``: ``out`` is ``(B, T, H, D)`` contiguous in
        ``v``'s dtype (so the head merge is a view); ``probs`` is the
        ``(B, H, T, T)`` pre-dropout softmax in ``probs_dtype`` when
        ``return_attn`` is true (zeros above the diagonal, as the softmax
        gives), else ``None``.
        """
        B, H, T, D = q.shape
        scale = 1.0 / math.sqrt(D)
        probs_dtype = torch.promote_types(v.dtype, torch.float32)
        v = v.contiguous()  # (B, H, T, D); once here, not once per block inside matmul
        out = v.new_empty(B, T, H, D)  # (B, T, H, D), filled block by block
        probs_full: torch.Tensor | None = None
        if return_attn and T > self.QUERY_BLOCK:
            probs_full = q.new_zeros(B, H, T, T, dtype=probs_dtype)  # (B, H, T, T)
        for r0 in range(0, T, self.QUERY_BLOCK):
            r1 = min(T, r0 + self.QUERY_BLOCK)
            scores = q[:, :, r0:r1] @ k[:, :, :r1].transpose(-2, -1)  # (B, H, R, r1)
            # in place where .to is a no-op: the matmul keeps no output for backward
            scores = scores.to(probs_dtype).mul_(scale)  # (B, H, R, r1)
            visible = self.mask[:, :, r0:r1, :r1]  # (1, 1, R, r1) view of the buffer
            scores = scores.masked_fill_(~visible, torch.finfo(scores.dtype).min)  # (B, H, R, r1)
            probs = torch.softmax(scores, dim=-1)  # (B, H, R, r1)
            block = self.attn_dropout(probs).to(v.dtype) @ v[:, :, :r1]  # (B, H, R, D)
            out[:, r0:r1] = block.transpose(1, 2)  # (B, R, H, D) into (B, T, H, D)
            if probs_full is not None:
                probs_full[:, :, r0:r1, :r1] = probs  # (B, H, R, r1) into (B, H, T, T)
        if not return_attn:
            return out, None
        return out, (probs if probs_full is None else probs_full)  # (B, H, T, T)
