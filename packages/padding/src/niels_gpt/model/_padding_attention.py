"""Padded attention: per-row RoPE positions, a key mask, and the in-place switch.

Shape notation::

    B: batch, n: tokens in one call (queries), m: keys seen by the call,
    p: first column of the call (0, or the cache length when generating),
    H: heads, D = C // H head dim, T = cfg.T

A batch is left-padded: row ``b`` has ``pads[b]`` leading pads. Column ``c``
of row ``b`` is real iff ``c >= pads[b]``, its RoPE position is
``max(c - pads[b], 0)`` (0 at the row's first real token, 0 for pads: table
row 0 is the identity), and a query at column ``c`` sees the keys
``[pads[b], c]``. One ``RowFrame`` carries ``pads`` for a whole call and
derives those per-step tensors once for every layer.

Masking happens on the scores, before the softmax: hidden keys get the dtype's
most negative finite value (not ``-inf``, so nothing is ever ``inf - inf``).
A padded query sees no key at all; its softmax row (uniform over the hidden
keys) is then set to exactly zero, in the forward and hence in the backward,
which is what SDPA's ``_safe_softmax`` gives a fully masked row
(pytorch#131060). Real queries' rows are unchanged: a hidden key's
``exp(min - max)`` underflows to exactly 0.

``PaddedAttention`` is a ``CausalSelfAttention`` (same parameters and
buffers); ``switched`` turns a model's attention modules into it in place for
the length of a call and gives each its class back afterwards, so ``GPT`` and
``Block`` run unchanged. ``PaddedCachedAttention`` adds a ``kv_cache``
(a ``kv_cache.KVCache`` that holds the padded frame: cache index = column).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Literal, cast, overload

import torch
from torch import nn

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError, check_features, check_length, check_like
from niels_gpt.model._padding_checks import check_rope_rows
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.kv_cache import KVCache

__all__ = [
    "PaddedAttention",
    "PaddedCachedAttention",
    "RowFrame",
    "apply_rope_rows",
    "new_caches",
    "rope_rows",
    "switched",
]


def apply_rope_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RoPE at per-row position ids, through one ``rope.apply_rope`` call.

    Args:
        q, k: ``(B, H, n, D)``, same shape, dtype and device; floating; ``D``
            even; ``B, n >= 1``.
        sin, cos: RoPE tables ``(1, 1, Tc, D/2)`` as ``rope.rope_cache`` builds
            them, in q's dtype and on its device.
        positions: ``(B, n)`` int64 on q's device, each in ``[0, Tc)``: the
            table row token ``i`` of row ``b`` is rotated by.

    Returns:
        ``(q_rot, k_rot)``, ``(B, H, n, D)`` in q's dtype and device; row ``b``
        is ``rope.apply_rope(q[b:b+1], k[b:b+1], sin[:, :, positions[b]],
        cos[:, :, positions[b]])``.

    Raises:
        InputError: any input out of its contract (one host sync reads the
            positions' range), before rope is called; nothing is cast.
    """
    check_rope_rows(q, k, sin, cos, positions)
    return rope_rows(q, k, sin, cos, positions)


def rope_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    sin: torch.Tensor,
    cos: torch.Tensor,
    positions: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rope_rows`` without its checks (the padded attention's positions are
    in range by construction).

    The batch is folded into the position axis: q and k become ``(1, H, B*n,
    D)`` with row ``b*n + i`` holding ``q[b, :, i]``, the tables ``(1, 1, B*n,
    D/2)`` with row ``b*n + i`` the table row ``positions[b, i]``. RoPE acts on
    each position alone, so one ``rope.apply_rope`` call on the fold rotates
    every row at its own positions with the rope stage's own code.
    """
    B, H, n, D = q.shape
    rows = positions.reshape(B * n)  # (B*n,) table row of each folded position
    sin_fold = sin[0, 0][rows].view(1, 1, B * n, D // 2)  # (1, 1, B*n, D/2)
    cos_fold = cos[0, 0][rows].view(1, 1, B * n, D // 2)  # (1, 1, B*n, D/2)
    q_fold = q.transpose(0, 1).reshape(1, H, B * n, D)  # (1, H, B*n, D)
    k_fold = k.transpose(0, 1).reshape(1, H, B * n, D)  # (1, H, B*n, D)
    q_rot, k_rot = rope.apply_rope(q_fold, k_fold, sin_fold, cos_fold)  # (1, H, B*n, D) each
    q_out = q_rot.view(H, B, n, D).transpose(0, 1)  # (B, H, n, D)
    k_out = k_rot.view(H, B, n, D).transpose(0, 1)  # (B, H, n, D)
    return q_out, k_out


class RowFrame:
    """The padding of one left-padded batch, and what each call derives from it.

    ``pads``: ``(B,)`` int64, the leading pads of each row, on the model's
    device. ``step(p, n)`` gives the positions and masks of columns
    ``[p, p + n)``, computed once for all layers of one forward.
    """

    def __init__(self, pads: torch.Tensor) -> None:
        self.pads = pads  # (B,)
        self._last: tuple[tuple[int, int], tuple[torch.Tensor, ...]] | None = None

    def step(self, p: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(positions, hidden, padded_query)`` for queries at columns ``[p, p + n)``.

        - positions ``(B, n)`` int64: ``max(column - pads, 0)``;
        - hidden ``(B, 1, n, p + n)`` bool: True where a key is masked (later
          than the query, or a pad);
        - padded_query ``(B, 1, n, 1)`` bool: True for a pad's query row.
        """
        if self._last is not None and self._last[0] == (p, n):
            positions, hidden, padded_query = self._last[1]
            return positions, hidden, padded_query
        pads = self.pads[:, None]  # (B, 1)
        rows = torch.arange(p, p + n, device=pads.device)  # (n,) query columns
        cols = torch.arange(p + n, device=pads.device)  # (p + n,) key columns
        positions = (rows[None, :] - pads).clamp(min=0)  # (B, n)
        later = cols[None, :] > rows[:, None]  # (n, p + n) causal
        pad_key = cols[None, :] < pads  # (B, p + n)
        hidden = later[None, None] | pad_key[:, None, None, :]  # (B, 1, n, p + n)
        padded_query = (rows[None, :] < pads)[:, None, :, None]  # (B, 1, n, 1)
        self._last = ((p, n), (positions, hidden, padded_query))
        return positions, hidden, padded_query


class PaddedAttention(CausalSelfAttention):
    """``CausalSelfAttention`` over a left-padded batch described by ``row_frame``.

    Same constructor, parameters and buffers as the parent. With ``row_frame``
    None (a module built directly) it is the parent's forward.
    """

    row_frame: RowFrame | None = None

    # The overloads narrow the return type by the flag, as the parent's do; the
    # last ``def`` is the one that runs.
    @overload
    def forward(self, x: torch.Tensor, *, return_attn: Literal[False] = ...) -> torch.Tensor: ...

    @overload
    def forward(
        self, x: torch.Tensor, *, return_attn: Literal[True]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...

    @overload
    def forward(
        self, x: torch.Tensor, *, return_attn: bool = ...
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``x`` ``(B, n, C)`` at columns ``p .. p+n-1`` of the padded frame.

        Returns ``y`` ``(B, n, C)``; with ``return_attn=True`` also the
        pre-dropout probabilities ``(B, H, n, p + n)`` in float32 (float64 in a
        float64 module): exactly 0 at hidden keys and on padded query rows.

        Raises:
            InputError: ``x`` as the parent checks it.
        """
        frame = self.row_frame
        if frame is None:
            return super().forward(x, return_attn=return_attn)
        check_features(x, "x", ndim=3, last=self.cfg.C)
        check_like(x, "x", self.qkv.weight, "attention")
        B, n, C = x.shape
        check_length(n, self.cfg.T)
        H, D = self.n_head, self.head_dim
        p = self._start(n)
        positions, hidden, padded_query = frame.step(p, n)

        q, k, v = self.qkv(x).split(C, dim=-1)  # (B, n, C) each
        q = q.view(B, n, H, D).transpose(1, 2)  # (B, H, n, D)
        k = k.view(B, n, H, D).transpose(1, 2)  # (B, H, n, D)
        v = v.view(B, n, H, D).transpose(1, 2)  # (B, H, n, D)
        q, k = self._rotate_rows(q, k, positions, v.dtype)  # (B, H, n, D) each
        keys, values = self._keys_values(k, v)  # (B, H, p + n, D) each
        out, probs = self._attend_padded(q, keys, values, hidden, padded_query)  # (B, n, H, D)
        y: torch.Tensor = self.resid_dropout(self.proj(out.reshape(B, n, C)))  # (B, n, C)
        if return_attn:
            return y, probs  # (B, n, C), (B, H, n, p + n)
        return y

    def _start(self, n: int) -> int:
        """The first column of a call of ``n`` tokens: 0 without a cache."""
        return 0

    def _keys_values(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The keys and values the call's queries attend over: its own, ``(B, H, n, D)``."""
        return k, v

    def _rotate_rows(
        self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE of ``(B, H, n, D)`` q and k at per-row ``positions`` ``(B, n)``, back in ``dtype``.

        The module's table rows at the positions rotate q and k; the rotation runs
        in float32 or wider, as the explicit path does under autocast; every
        ``.to`` is a no-op in a float32 or float64 module outside autocast.
        """
        work = torch.promote_types(torch.promote_types(q.dtype, self.rope_sin.dtype), torch.float32)
        sin = self.rope_sin.to(work)  # (1, 1, T, D/2)
        cos = self.rope_cos.to(work)  # (1, 1, T, D/2)
        q_rot, k_rot = rope_rows(q.to(work), k.to(work), sin, cos, positions)  # (B, H, n, D) each
        return q_rot.to(dtype), k_rot.to(dtype)  # (B, H, n, D) each

    def _attend_padded(
        self,
        q: torch.Tensor,
        keys: torch.Tensor,
        values: torch.Tensor,
        hidden: torch.Tensor,
        padded_query: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``softmax(mask(q keys^T / sqrt(D))) @ values`` with padded query rows zeroed.

        ``q`` ``(B, H, n, D)``, ``keys``/``values`` ``(B, H, m, D)``, ``hidden``
        ``(B, 1, n, m)``, ``padded_query`` ``(B, 1, n, 1)``. Scale, mask and
        softmax run in float32 or wider; the dropped-out probabilities meet
        ``values`` in their dtype. Returns ``out`` ``(B, n, H, D)`` and the
        pre-dropout probabilities ``(B, H, n, m)``.
        """
        probs_dtype = torch.promote_types(values.dtype, torch.float32)
        scores = q @ keys.transpose(-2, -1)  # (B, H, n, m)
        scores = scores.to(probs_dtype).mul_(1.0 / math.sqrt(self.head_dim))  # (B, H, n, m)
        scores = scores.masked_fill_(hidden, torch.finfo(probs_dtype).min)  # (B, H, n, m)
        probs = torch.softmax(scores, dim=-1)  # (B, H, n, m)
        probs = probs.masked_fill(padded_query, 0.0)  # (B, H, n, m), padded queries all zero
        out = self.attn_dropout(probs).to(values.dtype) @ values  # (B, H, n, D)
        return out.transpose(1, 2), probs  # (B, n, H, D), (B, H, n, m)


class PaddedCachedAttention(PaddedAttention):
    """``PaddedAttention`` that appends to, and attends over, an attached ``KVCache``.

    The cache holds the padded frame: index ``c`` is column ``c``. A call of
    ``n`` tokens at cache length ``p`` writes its rotated keys and values to
    rows ``[p, p + n)`` in place and attends over rows ``[0, p + n)``.
    """

    kv_cache: KVCache | None = None

    def _start(self, n: int) -> int:
        cache = self.kv_cache
        if cache is None:
            return 0
        p = len(cache)
        if p + n > cache.keys.shape[2]:
            raise InputError(
                f"a chunk of {n} tokens after {p} cached ones needs {p + n} positions; "
                f"the KV cache holds {cache.keys.shape[2]}"
            )
        return p

    def _keys_values(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(B, H, n, D)`` k, v into the cache; the filled rows ``(B, H, p + n, D)``."""
        cache = self.kv_cache
        if cache is None:
            return k, v
        return cache._append(k, v)  # (B, H, p + n, D) each, views of the cache


def _attention_modules(model: nn.Module) -> list[CausalSelfAttention]:
    return [m for m in model.modules() if isinstance(m, CausalSelfAttention)]


def new_caches(model: nn.Module, batch_size: int) -> list[KVCache]:
    """One zero-filled ``KVCache(batch_size, H, cfg.T, D)`` per attention module of
    ``model``, in ``model.modules()`` order, in its parameters' dtype and device."""
    return [
        KVCache(
            batch_size,
            m.n_head,
            m.cfg.T,
            m.head_dim,
            dtype=m.qkv.weight.dtype,
            device=m.qkv.weight.device,
        )
        for m in _attention_modules(model)
    ]


@contextmanager
def switched(
    model: nn.Module, frame: RowFrame, caches: list[KVCache] | None = None
) -> Iterator[None]:
    """Run every attention module of ``model`` as padded attention for the block.

    The model was checked (``check_model``): its attention modules are explicit
    or fast path. Each becomes ``PaddedAttention`` (``PaddedCachedAttention``
    with ``caches[i]`` attached, in ``model.modules()`` order) with ``frame``
    attached; only the class and those attributes change, and on leaving the
    block, normally or by an exception, each module gets its class back and
    loses the attributes.
    """
    modules = _attention_modules(model)
    target = PaddedAttention if caches is None else PaddedCachedAttention
    done: list[tuple[CausalSelfAttention, type[CausalSelfAttention]]] = []
    try:
        for i, module in enumerate(modules):
            base = type(module)
            module.__class__ = target
            padded = cast(PaddedCachedAttention, module)  # PaddedAttention: no kv_cache set
            padded.row_frame = frame
            if caches is not None:
                padded.kv_cache = caches[i]
            done.append((module, base))
        yield
    finally:
        for module, base in done:
            padded = cast(PaddedCachedAttention, module)
            del padded.row_frame
            if caches is not None:
                del padded.kv_cache
            module.__class__ = base
