"""Causal multi-head self-attention with rotary position embeddings: the one attention.

Shape notation::

    B: batch, T: tokens in this call (<= cfg.T), C: width, H: heads, D = C // H,
    H_kv: key/value heads (cfg.kv_heads, dividing H), G = H // H_kv: the query
    heads reading one key/value head, p: cache length before the call,
    m = p + T: the keys the call's queries see

One implementation serves every use. ``forward(x)`` is seed 000's module;
keyword arguments and one attribute extend it without changing it:

- ``positions`` ``(B, T)``: each row's RoPE positions (left-padded rows count
  from their first real token). Without it, positions are ``p .. p+T-1``.
- ``key_mask`` ``(B, m)`` bool: True = a key that may be seen. A query sees
  key ``j`` iff ``j <= p + i`` and ``key_mask[b, j]``; a query that sees no key
  gets an all-zero probability row (SDPA's ``_safe_softmax``), never NaN.
- ``kv_cache``, an attribute a caller sets up (``KVCache``): the call's
  rotated keys and values are appended at rows ``[p, p+T)`` and the queries
  attend over rows ``[0, p+T)``. A module holds no cache until one is set.
- ``kernel``, an attribute (``None``: the explicit core below): a fused causal
  kernel another stage provides, chosen in one place (``_core``) for every call
  without probabilities or a key mask, cached ones too (``AttentionKernel``).
  The others run the explicit core, written without SDPA so its probabilities
  can be returned.

Grouped-query attention (``cfg.H_kv``): the fused projection yields ``H`` query
heads and ``H_kv`` key/value heads; query head ``h`` reads key/value head
``h // G`` (``repeat_interleave``'s order). The cache holds ``H_kv`` heads, a
kernel gets them as they are, and the explicit core groups the ``G`` queries of
each key/value head into one matrix product instead of copying keys. With
``H_kv = H`` (``G = 1``) every grouping is a view of the same shape: the
multi-head module, bit for bit.

RoPE is reached through the module object (``rope.apply_rope``): tests monkeypatch it.

Mixed precision (``torch.autocast``, or a bfloat16/float16 module): RoPE
rotates in float32 (float64 in a float64 module; ``_rope_dtype``) and the
rotated q/k come back to the activation dtype; scores are scaled, masked and
soft-maxed in float32 (float64) whatever dtype their matmul ran in, and the
probabilities are returned in it (seed 004's float32 trace), cast to the
activation dtype only to meet ``v``. Everything else follows autocast. Why
(rounding, and the timings of ``python -m benchmarks.rope_autocast``): the
package README.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, overload

import torch
from torch import nn

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError, check_features, check_length, check_like
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention._call import KVCache, check_call, rotate_at, rotate_rows

__all__ = ["AttentionKernel", "CausalSelfAttention", "KVCache", "attention_modules", "rotate_rows"]

#: ``kernel(q, k, v, dropout_p, scale)``: causal attention of rotated q ``(B, H, T, D)``
#: and k, v ``(B, H_kv, m, D)``, ``m = p + T >= T`` (``p`` cached positions first):
#: query ``i`` sees keys ``0 .. p + i`` (bottom-right aligned), query head ``h``
#: reads key/value head ``h // (H // H_kv)``, dropout ``dropout_p`` on the
#: probabilities; returns ``(B, H, T, D)``.
AttentionKernel = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float, float], torch.Tensor]


def _rope_dtype(activation: torch.dtype, table: torch.dtype) -> torch.dtype:
    """RoPE's dtype: the widest of the activations', the tables' and float32 (float64+)."""
    return torch.promote_types(torch.promote_types(activation, table), torch.float32)


class CausalSelfAttention(nn.Module):
    """Fused-QKV causal self-attention; RoPE on q and k; ``cfg.kv_heads`` key/value heads.

    ``qkv`` is ``Linear(C, C + 2 * H_kv * D)``, its output ``q | k | v`` of
    widths ``C``, ``H_kv * D``, ``H_kv * D`` (``3 * C`` when ``H_kv = H``).

    Buffers (all non-persistent, so ``state_dict`` holds only weights, and
    all moved by ``.to()``):

    - ``rope_sin``, ``rope_cos``: ``(1, 1, cfg.T, D // 2)`` RoPE tables, float32
      until the module is converted to another dtype.
    - ``mask``: ``(1, 1, cfg.T, cfg.T)`` bool, lower triangular (True = visible).

    Attributes a caller may set (neither is saved in ``state_dict``):

    - ``kernel``: ``None`` (the explicit core, how a module starts) or an
      ``AttentionKernel`` for calls without probabilities or a key mask.
    - ``kv_cache``: absent until a caller sets up a ``KVCache``; ``None`` or
      deleting it drops it again.

    Dropout: ``attn_dropout`` on the probabilities after softmax,
    ``resid_dropout`` after the output projection. Call ``eval()`` to disable.
    """

    rope_sin: torch.Tensor
    rope_cos: torch.Tensor
    mask: torch.Tensor
    kernel: AttentionKernel | None
    kv_cache: KVCache | None
    n_kv_head: int  # key/value heads, cfg.kv_heads (H unless cfg.H_kv is given)

    #: Query rows scored per block in the attention core (see ``_attend``).
    QUERY_BLOCK: int = 128

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_head = cfg.H
        self.n_kv_head = cfg.kv_heads
        self.head_dim = cfg.C // cfg.H
        self.qkv = nn.Linear(cfg.C, cfg.C + 2 * self.n_kv_head * self.head_dim, bias=False)
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
        self.kernel = None

    # Typed views of the one forward below: the flag decides the return type.
    @overload
    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: Literal[False] = False,
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor: ...
    @overload
    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: Literal[True],
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: bool = False,
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: bool = False,
        positions: torch.Tensor | None = None,
        key_mask: torch.Tensor | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend causally over ``x`` (and over the cache's keys, when one is set up).

        Args:
            x: ``(B, T, C)`` with ``1 <= T <= cfg.T``, on the module's device
                and in its dtype (float32 unless the module was converted).
            return_attn: also return the attention probabilities.
            positions: ``None`` (positions ``p .. p+T-1``) or ``(B, T)`` int64
                RoPE positions in ``[0, cfg.T)``, row by row.
            key_mask: ``None`` (every key visible) or ``(B, p + T)`` bool, True
                for a key the row's queries may see (causality still holds).

        Returns:
            ``y`` of shape ``(B, T, C)`` in the module's dtype, or in the
            autocast dtype under ``torch.autocast``; with ``return_attn=True``
            the pair ``(y, attn)`` where ``attn`` is ``(B, H, T, p + T)``: the
            softmax output *before* attention dropout, in float32 (float64 in
            a float64 module), under autocast too.

        Raises:
            InputError (an AssertionError): wrong rank or width, ``T > cfg.T``,
                a dtype/device that differs from the module's, or (nothing is
                written) a cache, positions or key mask that do not fit.
        """
        check_features(x, "x", ndim=3, last=self.cfg.C)
        check_like(x, "x", self.qkv.weight, "attention")
        B, T, C = x.shape
        check_length(T, self.cfg.T)
        H, Hk, D = self.n_head, self.n_kv_head, self.head_dim
        cache = getattr(self, "kv_cache", None)  # absent until a caller sets one up
        limits = (Hk, D, self.cfg.T)
        p = 0
        if cache is not None or positions is not None or key_mask is not None:
            p = check_call(x, self.qkv.weight, cache, positions, key_mask, limits)

        q, k, v = self.qkv(x).split((C, Hk * D, Hk * D), dim=-1)  # (B, T, C), (B, T, Hk*D) x2
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D) strided view
        k = k.view(B, T, Hk, D).transpose(1, 2)  # (B, H_kv, T, D) strided view
        v = v.view(B, T, Hk, D).transpose(1, 2)  # (B, H_kv, T, D) strided view
        q_rot, k_rot = rotate_at(*self._rope_operands(q, k), p, positions)  # float32+
        q, k = q_rot.to(v.dtype), k_rot.to(v.dtype)  # (B, H, T, D), (B, H_kv, T, D)
        if cache is not None:
            k, v = cache.append(k, v)  # (B, H_kv, p + T, D) each, views of the cache
        plain = key_mask is None  # a kernel may serve it, through the cache or not
        out, probs = self._core(q, k, v, p, key_mask, return_attn, plain)  # (B, T, H, D)
        y: torch.Tensor = self.resid_dropout(self.proj(out.view(B, T, C)))  # (B, T, C)
        if probs is not None:  # exactly when return_attn is true
            return y, probs
        return y

    def _rope_operands(
        self, q: torch.Tensor, k: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q, k, sin, cos)`` for ``rope.apply_rope``, all in ``_rope_dtype``.

        ``q``: ``(B, H, T, D)``, ``k``: ``(B, H_kv, T, D)``. Every ``.to`` is a
        no-op in a float32 or float64 module outside autocast, and then skipped.
        """
        work = _rope_dtype(q.dtype, self.rope_sin.dtype)
        if q.dtype == work and self.rope_sin.dtype == work:
            return q, k, self.rope_sin, self.rope_cos  # nothing to cast
        return (
            q.to(work),  # (B, H, T, D)
            k.to(work),  # (B, H_kv, T, D)
            self.rope_sin.to(work),  # (1, 1, cfg.T, D/2)
            self.rope_cos.to(work),  # (1, 1, cfg.T, D/2)
        )

    def _core(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        p: int,
        key_mask: torch.Tensor | None,
        return_attn: bool,
        plain: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The one place a kernel is chosen: ``self.kernel`` for a call without a key mask
        or probabilities (``plain``: no key mask; ``k``, ``v`` hold ``H_kv`` heads of
        ``p + T`` rows),
        else the explicit ``_attend``, whose ``(out, probs)`` it returns."""
        kernel = self.kernel
        if kernel is None or return_attn or not plain:
            return self._attend(q, k, v, p, key_mask, return_attn=return_attn)
        dropout_p = self.attn_dropout.p if self.training else 0.0
        out = kernel(q, k, v, dropout_p, 1.0 / math.sqrt(q.shape[-1]))  # (B, H, T, D)
        return out.transpose(1, 2).contiguous(), None  # (B, T, H, D)

    def _attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        p: int,
        key_mask: torch.Tensor | None,
        *,
        return_attn: bool,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The explicit core: ``softmax(mask(q k^T / sqrt(D))) @ v``, dropout on the probs.

        ``q`` is ``(B, H, T, D)`` at positions ``p .. p+T-1``; ``k`` and ``v`` are
        ``(B, H_kv, p + T, D)``. Query ``i`` sees key ``j`` iff ``j <= p + i`` (the
        tril buffer's rows ``[p, p+T)``) and ``key_mask[b, j]``. The ``G`` query
        heads of one key/value head are stacked along the rows of one product
        (``(B, H_kv, G * R, D)``), so no key or value is copied; ``G = 1`` makes
        every such reshape a view of the same shape.

        Queries go in blocks of ``QUERY_BLOCK`` rows; a block at positions
        ``[r0, r1)`` scores keys ``[0, r1)`` only (every later key is masked for
        all of its rows: skipping it changes nothing but the work). Each block:
        scale, ``masked_fill`` with ``finfo.min`` where not visible, softmax,
        rows that see no key set to zero (only a key mask makes one),
        ``attn_dropout`` on the probabilities, ``@ v``. Scale, mask and softmax
        run in ``probs_dtype`` (float32, float64 in a float64 module); the
        dropped-out probabilities meet ``v`` in ``v``'s dtype.

        Returns ``(out, probs)``: ``out`` is ``(B, T, H, D)`` contiguous in
        ``v``'s dtype (so the head merge is a view); ``probs`` is the
        ``(B, H, T, p + T)`` pre-dropout softmax in ``probs_dtype`` when
        ``return_attn`` is true (zeros where not visible), else ``None``.
        """
        B, H, T, D = q.shape
        Hk = k.shape[1]  # key/value heads; G = H // Hk query heads each
        S = p + T  # keys seen by the last query
        scale = 1.0 / math.sqrt(D)
        probs_dtype = torch.promote_types(v.dtype, torch.float32)
        if T > self.QUERY_BLOCK:
            v = v.contiguous()  # (B, H, S, D); once here, not once per block inside matmul
        out = v.new_empty(B, T, H, D)  # (B, T, H, D), filled block by block
        allowed = self.mask[:, :, p:S, :S]  # (1, 1, T, S) view of the tril buffer
        if key_mask is not None:
            allowed = allowed & key_mask[:, None, None, :]  # (B, 1, T, S)
        probs_full: torch.Tensor | None = None
        if return_attn and T > self.QUERY_BLOCK:
            probs_full = q.new_zeros(B, H, T, S, dtype=probs_dtype)  # (B, H, T, S)
        QB = self.QUERY_BLOCK  # one block: no range over p, which compiles as a symbolic size
        blocks = [(p, S)] if T <= QB else [(r0, min(S, r0 + QB)) for r0 in range(p, S, QB)]
        for r0, r1 in blocks:
            rows = slice(r0 - p, r1 - p)  # the block's queries, in this call's coordinates
            GR = H // Hk * (r1 - r0)  # G query heads of R = r1 - r0 rows, stacked
            q_g = q[:, :, rows].reshape(B, Hk, GR, D)  # (B, H_kv, G*R, D)
            scores = q_g @ k[:, :, :r1].transpose(-2, -1)  # (B, H_kv, G*R, r1)
            scores = scores.view(B, H, r1 - r0, r1)  # (B, H, R, r1) view
            # in place where .to is a no-op: the matmul keeps no output for backward
            scores = scores.to(probs_dtype).mul_(scale)  # (B, H, R, r1)
            visible = allowed[:, :, rows, :r1]  # (B or 1, 1, R, r1) view
            scores = scores.masked_fill_(~visible, torch.finfo(scores.dtype).min)  # (B, H, R, r1)
            probs = torch.softmax(scores, dim=-1)  # (B, H, R, r1)
            if key_mask is not None:  # a query that sees no key: an all-zero row
                probs = probs.masked_fill(~visible.any(-1, keepdim=True), 0.0)  # (B, H, R, r1)
            kept = self.attn_dropout(probs).to(v.dtype)  # (B, H, R, r1)
            block = kept.reshape(B, Hk, GR, r1) @ v[:, :, :r1]  # (B, H_kv, G*R, D)
            block = block.view(B, H, r1 - r0, D)  # (B, H, R, D) view
            out[:, rows] = block.transpose(1, 2)  # (B, R, H, D) into (B, T, H, D)
            if probs_full is not None:
                probs_full[:, :, rows, :r1] = probs  # (B, H, R, r1) into (B, H, T, S)
        if not return_attn:
            return out, None
        return out, (probs if probs_full is None else probs_full)  # (B, H, T, S)


def attention_modules(model: nn.Module) -> list[tuple[str, CausalSelfAttention]]:
    """Every ``CausalSelfAttention`` in ``model``, subclasses and ``model`` itself included.

    The one walk of the stages that set something on each attention module
    (fastpath's kernel, kv_cache's caches, padding's checks and hooks); each
    keeps its own policy on what it finds.

    Returns:
        ``(name, module)`` pairs in ``model.named_modules()`` order (pre-order),
        named as there (``""`` for ``model`` itself, the prefix of that module's
        ``state_dict`` keys otherwise); a module held twice is listed once,
        under its first name. Nothing on ``model`` changes.

    Raises:
        InputError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be an nn.Module, got {type(model).__name__}")
    return [
        (name, module)
        for name, module in model.named_modules()
        if isinstance(module, CausalSelfAttention)
    ]
