"""Generation through a per-layer KV cache: prefill once, then one token a step.

Shape notation::

    B: batch, t: prompt length, n: tokens in one cached call, p: cache length
    before the call, H: heads, D = C // H head dim, T = cfg.T, V: vocabulary

The cache lives in the attention modules. ``use_kv_cache`` turns every
attention module of a model (explicit or fast path) into a
``KVCacheAttention`` in place and attaches a fresh ``KVCache`` to each; the
model's own ``forward`` and ``forward_with_attn_trace`` are then the cached
step: a call on ``n`` tokens computes positions ``p .. p+n-1`` and writes their
rotated keys and values into rows ``[p, p+n)`` of caches allocated once. So
the block wiring of the backbone runs unchanged, and ``drop_kv_cache`` gives
each module its class back. ``generate`` does all of that around a prefill and
one single-token step per further token.

A step reads the cache length ``p`` from tensor metadata (the size of a view
of the filled rows), never from a tensor's values, so nothing in it waits on
the device; it slices the caches to the filled rows ``[0, p+n)``, so a decode
step costs O(p). Under ``torch.compile`` that size becomes symbolic after the
first recompilation: one graph serves every later position, with no graph
break.
"""

from __future__ import annotations

import math
from typing import Literal, cast, overload

import torch
from torch import nn

import niels_gpt.model.rope as rope
from niels_gpt.checks import InputError, check_features, check_length, check_like
from niels_gpt.model._kv_sampling import check_generate_args, choose_next, filter_logits
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.gpt import GPT

__all__ = [
    "KVCache",
    "KVCacheAttention",
    "drop_kv_cache",
    "filter_logits",
    "generate",
    "use_kv_cache",
]

# The fast path is recognised by name: this stage does not depend on it.
_FAST_CLASS = ("niels_gpt.model.fastpath", "FastCausalSelfAttention")


def _positive_int(value: object, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise InputError(f"{name} must be an int >= 1, got {type(value).__name__} {value!r}")
    return value


class KVCache:
    """One attention layer's keys and values, allocated once.

    ``keys`` and ``values`` are ``(batch_size, n_head, max_len, head_dim)``,
    zero-filled in ``dtype`` on ``device``. ``len(cache)`` is the number ``p``
    of filled positions: rows ``[0, p)`` of dim 2 hold the rotated keys and the
    values of those positions. A cached call writes into the same storage; the
    tensors are never replaced or resized.

    Raises:
        InputError: a size that is not a positive int (``bool`` included), or
            a ``dtype`` that is not a floating ``torch.dtype``.
    """

    keys: torch.Tensor
    values: torch.Tensor

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
        shape = (
            _positive_int(batch_size, "batch_size"),
            _positive_int(n_head, "n_head"),
            _positive_int(max_len, "max_len"),
            _positive_int(head_dim, "head_dim"),
        )
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise InputError(f"KVCache dtype must be a floating torch.dtype, got {dtype!r}")
        self.keys = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, D)
        self.values = torch.zeros(shape, dtype=dtype, device=device)  # (B, H, max_len, D)
        # The length is the size of a view of the filled rows, not an int attribute:
        # torch.compile treats a tensor's size as a symbolic int (one graph for every
        # length), but specialises on an int attribute (one graph per length).
        self._filled = self.keys[:, :, :0]  # (B, H, p, D) view, p = 0

    def __len__(self) -> int:
        return self._filled.shape[2]

    def _append(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``(B, H, n, D)`` keys and values at rows ``[p, p+n)``; advance to ``p + n``.

        Returns the filled rows ``[0, p+n)`` of both, ``(B, H, p+n, D)`` views.
        The caller has checked that they fit.
        """
        p = len(self)
        end = p + k.shape[2]
        self.keys[:, :, p:end] = k  # (B, H, n, D) into the storage
        self.values[:, :, p:end] = v  # (B, H, n, D) into the storage
        self._filled = self.keys[:, :, :end]  # (B, H, p+n, D) view
        return self.keys[:, :, :end], self.values[:, :, :end]  # (B, H, p+n, D) each


class KVCacheAttention(CausalSelfAttention):
    """``CausalSelfAttention`` that reads and appends to an attached ``KVCache``.

    Same constructor, parameters, buffers and ``state_dict`` as the parent.
    Without a cache (``kv_cache is None``, how a module built directly
    starts) it computes what the parent computes.
    """

    kv_cache: KVCache | None = None

    # The overloads only narrow the return type for type checkers: the last
    # ``def`` is the one that runs (and the one the API check reads).
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
        """Attend from ``x`` of shape ``(B, n, C)``, positions ``p .. p+n-1``, over the cache.

        With a cache of length ``p``: q and k are rotated by ``rope.apply_rope``
        with table rows ``[p, p+n)``, k and v are written to cache rows
        ``[p, p+n)``, and query ``i`` attends to rows ``[0, p+i]``. Scale,
        softmax, dropouts and autocast dtypes are those of the explicit path.

        Returns:
            ``y`` ``(B, n, C)``; with ``return_attn=True`` also the ``(B, H, n,
            p+n)`` softmax rows over every filled position, before dropout.

        Raises:
            InputError: ``x`` as the parent checks it, or (nothing is written)
                a batch other than the cache's, ``p + n`` past the cache or
                ``cfg.T``, or a cache of another dtype, device or head shape.
        """
        cache = self.kv_cache
        if cache is None:
            return super().forward(x, return_attn=return_attn)
        self._check_chunk(x, cache)
        B, n, C = x.shape
        p, H, D = len(cache), self.n_head, self.head_dim

        q, k, v = self.qkv(x).split(C, dim=-1)  # (B, n, C) each
        q = q.view(B, n, H, D).transpose(1, 2)  # (B, H, n, D)
        k = k.view(B, n, H, D).transpose(1, 2)  # (B, H, n, D)
        v = v.view(B, n, H, D).transpose(1, 2)  # (B, H, n, D)
        q, k = self._rotate(q, k, p, v.dtype)  # (B, H, n, D) each, positions p .. p+n-1
        keys, values = cache._append(k, v)  # (B, H, p+n, D) each, views of the cache
        out, probs = self._attend_cached(q, keys, values, p, v.dtype)  # (B, n, H, D)
        y: torch.Tensor = self.resid_dropout(self.proj(out.reshape(B, n, C)))  # (B, n, C)
        if return_attn:
            return y, probs  # (B, n, C), (B, H, n, p+n)
        return y

    def _remember_base(self, base: type[CausalSelfAttention]) -> None:
        """Keep the class ``use_kv_cache`` switched from, for ``drop_kv_cache``."""
        self._kv_cache_base: type[CausalSelfAttention] = base

    def _check_chunk(self, x: torch.Tensor, cache: KVCache) -> None:
        check_features(x, "x", ndim=3, last=self.cfg.C)
        check_like(x, "x", self.qkv.weight, "attention")
        B, n, _ = x.shape
        check_length(n, self.cfg.T, "chunk length n")
        size, heads, max_len, head_dim = cache.keys.shape
        p = len(cache)
        if size != B:
            raise InputError(f"x batch must be the KV cache's batch {size}, got {B}")
        if (heads, head_dim) != (self.n_head, self.head_dim):
            raise InputError(
                f"KV cache heads and head dim must be ({self.n_head}, {self.head_dim}), "
                f"got ({heads}, {head_dim})"
            )
        if p + n > min(max_len, self.cfg.T):
            raise InputError(
                f"a chunk of {n} tokens after {p} cached ones needs {p + n} positions; "
                f"the KV cache holds {max_len} and cfg.T is {self.cfg.T}"
            )
        check_like(cache.keys, "KV cache", self.qkv.weight, "attention")

    def _rotate(
        self, q: torch.Tensor, k: torch.Tensor, p: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """RoPE at positions ``p .. p+n-1`` on ``(B, H, n, D)`` q and k, back in ``dtype``.

        The rotation runs in float32 or wider (the tables' dtype, or that of the
        activations if wider), as in the explicit path under autocast; every
        ``.to`` is a no-op in a float32 or float64 module outside autocast.
        """
        n = q.shape[2]
        work = torch.promote_types(torch.promote_types(q.dtype, self.rope_sin.dtype), torch.float32)
        sin = self.rope_sin[:, :, p : p + n].to(work)  # (1, 1, n, D/2)
        cos = self.rope_cos[:, :, p : p + n].to(work)  # (1, 1, n, D/2)
        q_rot, k_rot = rope.apply_rope(q.to(work), k.to(work), sin, cos)  # (B, H, n, D) each
        return q_rot.to(dtype), k_rot.to(dtype)  # (B, H, n, D) each

    def _attend_cached(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, p: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``softmax(mask(q keys^T / sqrt(D))) @ values`` for queries at ``p .. p+n-1``.

        ``q`` is ``(B, H, n, D)``, ``keys``/``values`` ``(B, H, p+n, D)``.
        Scores are scaled, masked and soft-maxed in float32 or wider, as the
        explicit path does; the probabilities meet ``values`` in ``dtype``.
        Returns ``out`` ``(B, n, H, D)`` and the pre-dropout ``probs``
        ``(B, H, n, p+n)``.
        """
        n, end = q.shape[2], keys.shape[2]
        probs_dtype = torch.promote_types(dtype, torch.float32)
        scores = q @ keys.transpose(-2, -1)  # (B, H, n, p+n)
        scores = scores.to(probs_dtype).mul_(1.0 / math.sqrt(self.head_dim))  # (B, H, n, p+n)
        if n > 1:  # a single query at p sees every filled row [0, p]: nothing to mask
            visible = self.mask[:, :, p:end, :end]  # (1, 1, n, p+n) view of the tril buffer
            scores = scores.masked_fill_(~visible, torch.finfo(probs_dtype).min)  # (B, H, n, p+n)
        probs = torch.softmax(scores, dim=-1)  # (B, H, n, p+n)
        out = self.attn_dropout(probs).to(dtype) @ values  # (B, H, n, D)
        return out.transpose(1, 2), probs  # (B, n, H, D), (B, H, n, p+n)


# --- the in-place switch ---------------------------------------------------------


def _switchable(module: nn.Module) -> bool:
    cls = type(module)
    return cls in (CausalSelfAttention, KVCacheAttention) or (
        (cls.__module__, cls.__qualname__) == _FAST_CLASS
    )


def _attention_modules(model: nn.Module) -> list[CausalSelfAttention]:
    """Every attention module inside ``model``, in ``model.modules()`` order.

    Raises ``InputError`` (a ``TypeError``) for a subclass of
    ``CausalSelfAttention`` whose math the switch does not know.
    """
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be an nn.Module, got {type(model).__name__}")
    found: list[CausalSelfAttention] = []
    for name, module in model.named_modules():
        if isinstance(module, CausalSelfAttention):
            if not _switchable(module):
                raise InputError(
                    f"{name or 'model'} is a {type(module).__qualname__}; the KV cache "
                    "switches only CausalSelfAttention, FastCausalSelfAttention and "
                    "KVCacheAttention"
                )
            found.append(module)
    return found


def use_kv_cache(model: nn.Module, batch_size: int) -> list[KVCache]:
    """Switch every attention module inside ``model`` to ``KVCacheAttention``, in place.

    ``model`` is a ``GPT``, a ``Block``, an attention module or any tree of
    them. Each explicit, fast-path or already cached attention module gets a
    fresh zero-filled ``KVCache(batch_size, H, cfg.T, D)`` in its parameters'
    dtype and device; only its class and ``kv_cache`` change (the same object,
    parameters, buffers, hooks and training flag), so calling it again resets.

    Returns:
        The caches, in ``model.modules()`` order (layer order for a ``GPT``).

    Raises:
        InputError (a ``TypeError``), before anything changes: ``model`` holds
            another subclass of ``CausalSelfAttention`` or no attention module
            at all, or ``batch_size`` is not a positive int.
    """
    modules = _attention_modules(model)
    if not modules:
        raise InputError(f"{type(model).__name__} holds no attention module to cache")
    _positive_int(batch_size, "batch_size")
    caches = [
        KVCache(
            batch_size,
            m.n_head,
            m.cfg.T,
            m.head_dim,
            dtype=m.qkv.weight.dtype,
            device=m.qkv.weight.device,
        )
        for m in modules
    ]  # all allocated before any module changes
    for module, cache in zip(modules, caches, strict=True):
        base = type(module)
        module.__class__ = KVCacheAttention
        switched = cast(KVCacheAttention, module)
        if base is not KVCacheAttention:
            switched._remember_base(base)
        switched.kv_cache = cache
    return caches


def _uncache(module: KVCacheAttention) -> None:
    """Detach the cache; a switched module gets its previous class back."""
    base = getattr(module, "_kv_cache_base", None)
    module.kv_cache = None
    if base is not None:
        del module.kv_cache, module._kv_cache_base  # leave no trace of the switch
        module.__class__ = base


def drop_kv_cache(model: nn.Module) -> nn.Module:
    """Undo ``use_kv_cache`` in place and return ``model``.

    Every cache is detached; each switched module gets back the class it had
    before its first ``use_kv_cache`` (explicit or fast path), and a
    ``KVCacheAttention`` built directly keeps its class.

    Raises:
        InputError: ``model`` is not an ``nn.Module``.
    """
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be an nn.Module, got {type(model).__name__}")
    for module in model.modules():
        if isinstance(module, KVCacheAttention):
            _uncache(module)
    return model


# --- generate -------------------------------------------------------------------------

_Saved = tuple[CausalSelfAttention, type, "KVCache | None"]


def _save(model: nn.Module) -> list[_Saved]:
    """Each attention module with its class and attached cache."""
    return [
        (m, type(m), getattr(m, "kv_cache", None))
        for m in model.modules()
        if isinstance(m, CausalSelfAttention)
    ]


def _restore(saved: list[_Saved]) -> None:
    """Put every attention module back as ``_save`` found it."""
    for module, cls, cache in saved:
        if isinstance(module, KVCacheAttention):
            if cls is KVCacheAttention:
                module.kv_cache = cache  # switched before generate: the caller's cache
            else:
                _uncache(module)  # switched by generate: its own class back


def _step(
    model: GPT, x: torch.Tensor, trace_layer: int | None, traces: list[torch.Tensor]
) -> torch.Tensor:
    """One cached forward of ``x`` ``(B, n)``; the ``(B, V)`` logits of its last position."""
    if trace_layer is None:
        logits: torch.Tensor = model(x)  # (B, n, V)
    else:
        logits, trace = model.forward_with_attn_trace(x, trace_layer)  # (B, n, V), trace
        traces.append(trace["attn_row"].contiguous())  # (B, H, p+n), not a view of the prefill's
    return logits[:, -1]  # (B, V)


def _decode(
    model: GPT,
    ids: torch.Tensor,
    t: int,
    knobs: tuple[float, int | None, float | None],
    eos_id: int | None,
    generator: torch.Generator | None,
    trace_layer: int | None,
) -> list[torch.Tensor]:
    """Fill ``ids[:, t:]`` of ``(B, t + new)`` ids on a switched model; return the traces."""
    temperature, top_k, top_p = knobs
    traces: list[torch.Tensor] = []
    finished = torch.zeros_like(ids[:, 0], dtype=torch.bool)  # (B,)
    x = ids[:, :t]  # (B, t): step 0 is the prefill
    for col in range(t, ids.shape[1]):
        logits = _step(model, x, trace_layer, traces)  # (B, V)
        token = choose_next(
            logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=generator
        )  # (B,), every row drawn, finished ones too
        if eos_id is not None:
            token = token.masked_fill(finished, eos_id)  # (B,), finished rows repeat eos
            finished |= token == eos_id  # (B,)
        ids[:, col] = token
        if eos_id is not None and bool(finished.all()):  # one host sync a step, with eos only
            ids[:, col + 1 :] = eos_id  # nothing left to generate
            break
        x = ids[:, col : col + 1]  # (B, 1): the next step's input
    return traces


def generate(
    model: GPT,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | None = None,
    trace_layer: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
    """Continue ``prompt_ids`` by ``max_new_tokens`` tokens through per-layer KV caches.

    Step 0 is the prefill (one forward of the whole prompt), every later step
    one forward of the previous token alone; the caches (``B`` rows, ``cfg.T``
    positions) are allocated once, before the prefill. Runs under
    ``torch.no_grad`` in the mode the model is in (``.eval()`` for
    deterministic logits) and hands the model back as it found it (classes,
    attached caches, training flags, weights), on return or on an error.

    Args:
        model: a ``GPT``, explicit or fast path, switched to a cache or not.
        prompt_ids: ``(B, t)`` int64 ids in ``[0, V)`` on the model's device.
        max_new_tokens: ``>= 0`` with ``t + max_new_tokens <= cfg.T``.
        temperature, top_k, top_p: as in ``filter_logits``. At temperature 0 a
            token is the argmax and ``generator`` is not used; otherwise one
            ``torch.multinomial`` draw a step over all rows (finished ones too).
        eos_id: a row that generates it is finished: it keeps the eos and holds
            ``eos_id`` at every later position (and is fed it). Generation
            stops when every row has finished. Prompt tokens do not count.
        generator: a ``torch.Generator`` on the model's device for the draws.
        trace_layer: also return, per step ``i``, the ``(B, H, t + i)``
            ``attn_row`` of that layer, as ``forward_with_attn_trace`` gives it.

    Returns:
        ``ids`` ``(B, t + max_new_tokens)`` int64 beginning with the prompt, or
        ``(ids, traces)`` when ``trace_layer`` is given.

    Raises:
        InputError: any argument out of its range, before any forward and
            before the model is switched.
    """
    knobs = (temperature, top_k, top_p)
    check_generate_args(model, prompt_ids, max_new_tokens, knobs, eos_id, generator, trace_layer)
    B, t = prompt_ids.shape
    ids = prompt_ids.new_empty(B, t + max_new_tokens)  # (B, t + new), filled as chosen
    ids[:, :t] = prompt_ids
    traces: list[torch.Tensor] = []
    if max_new_tokens > 0:
        saved = _save(model)
        try:
            with torch.no_grad():
                use_kv_cache(model, B)
                traces = _decode(model, ids, t, knobs, eos_id, generator, trace_layer)
        finally:
            _restore(saved)
    if trace_layer is None:
        return ids
    return ids, traces
