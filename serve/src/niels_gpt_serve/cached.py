"""A cached engine: one KV cache a layer for the whole running batch, rows joining and leaving.

Shape notation::

    R: rows in the cache, p: the cache's frame width (columns filled), n: tokens
    in one call, len_r: the tokens of row r, pad_r = p - len_r its leading pads,
    H: heads, D: head dim, V: vocabulary, T = cfg.T

Built on the attention stage's public API (1.1): ``KVCache``, the
``kv_cache`` attribute a caller sets on each ``CausalSelfAttention``, and the
forward's ``positions`` and ``key_mask``. The model's own ``forward`` runs
unchanged; for the length of a call, a forward pre-hook on each attention
module adds the call's positions and key mask to its keyword arguments (the
hooks and caches are taken off again after every call). Every row is right-aligned in
one frame: row ``r``'s tokens sit at columns ``[pad_r, p)``, its positions
count from 0 at its first token, and the key mask hides its pads, so its
logits are those of the row alone.

A step feeds every row's newest token at column ``p`` (cost ``O(R p)``, not
the ``O(R p^2)`` of recomputing). A request that joins is prefilled alone
(with the others that join with it), and its keys and values are then merged
into the running frame; a request that leaves is dropped from the frame by a
copy of the others' rows. Neither recomputes a running row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from niels_gpt.model.attention import KVCache, attention_modules
from niels_gpt.model.gpt import GPT
from niels_gpt_serve.engine import Tokens

__all__ = ["CachedEngine"]

_ABSENT = object()  # a module without a kv_cache attribute


class _Frame:
    """The running batch: each row's key and length, and one ``KVCache`` a layer."""

    def __init__(self, keys: list[int], lengths: list[int], caches: list[KVCache]) -> None:
        self.keys, self.lengths, self.caches = keys, lengths, caches

    @property
    def width(self) -> int:
        return len(self.caches[0]) if self.caches else 0


class CachedEngine:
    """Next-token logits of a batch from per-row KV caches (see the module docstring).

    Args:
        model: a ``GPT`` (v1, or the experiment's v0) in eval mode whose
            attention is the stage's ``CausalSelfAttention`` 1.1.
    """

    name = "cached (attention KVCache, per-row positions and key mask)"

    def __init__(self, model: GPT) -> None:
        self.model = model
        self.modules = [m for _, m in attention_modules(model)]  # layer order
        self.T = model.cfg.T
        self.device = model.tok_emb.weight.device
        self.frame = _Frame([], [], [])
        self._call: dict[str, torch.Tensor] = {}

    def close(self) -> None:
        """Nothing to give back: the model holds no hook or cache between calls."""

    def _with_call(
        self, module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        return args, {**kwargs, **self._call}

    def _caches(self, rows: int) -> list[KVCache]:
        return [
            KVCache(  # key/value heads: fewer than H under grouped-query attention
                rows, m.n_kv_head, self.T, m.head_dim, dtype=m.qkv.weight.dtype, device=self.device
            )
            for m in self.modules
        ]

    def _forward(
        self, ids: torch.Tensor, pads: torch.Tensor, caches: list[KVCache]
    ) -> torch.Tensor:
        """``(R, n)`` ids at the caches' next ``n`` columns; returns the last logits ``(R, V)``."""
        p, n = len(caches[0]), ids.shape[1]
        cols = torch.arange(p + n, device=self.device)  # (p + n,) key columns
        positions = (cols[None, p:] - pads[:, None]).clamp(min=0)  # (R, n)
        key_mask = cols[None, :] >= pads[:, None]  # (R, p + n): a row's pads are hidden
        self._call = {"positions": positions, "key_mask": key_mask}
        hooks = []
        found = [m.__dict__.get("kv_cache", _ABSENT) for m in self.modules]
        try:
            for module, cache in zip(self.modules, caches, strict=True):
                module.kv_cache = cache
                hooks.append(module.register_forward_pre_hook(self._with_call, with_kwargs=True))
            with torch.no_grad():
                logits: torch.Tensor = self.model(ids)  # (R, n, V)
        finally:  # the model as it was found: no hook, no cache
            for hook in hooks:
                hook.remove()
            for module, before in zip(self.modules, found, strict=True):
                if before is _ABSENT:
                    del module.kv_cache
                else:
                    module.kv_cache = before
            self._call = {}
        return logits[:, -1].float()  # (R, V)

    def _pads(self, frame: _Frame) -> torch.Tensor:
        return torch.tensor([frame.width - n for n in frame.lengths], device=self.device)  # (R,)

    def _reframe(self, parts: Sequence[tuple[_Frame, list[int]]]) -> _Frame:
        """A new frame of the given rows of the given frames, right-aligned, pads trimmed."""
        parts = [(f, rows) for f, rows in parts if rows]
        lengths = [f.lengths[r] for f, rows in parts for r in rows]
        keys = [f.keys[r] for f, rows in parts for r in rows]
        if not keys:
            return _Frame([], [], [])
        width = max(lengths)
        caches = self._caches(len(keys))
        for layer, cache in enumerate(caches):
            head = self.modules[layer]
            shape = (len(keys), head.n_kv_head, width, head.head_dim)
            k = torch.zeros(
                shape, dtype=head.qkv.weight.dtype, device=self.device
            )  # (R, H_kv, w, D)
            v = torch.zeros_like(k)  # (R, H_kv, w, D)
            i = 0
            for frame, rows in parts:
                old, p = frame.caches[layer], frame.width
                for r in rows:
                    n = frame.lengths[r]
                    k[i, :, width - n :] = old.keys[r, :, p - n : p]  # (H_kv, n, D)
                    v[i, :, width - n :] = old.values[r, :, p - n : p]  # (H_kv, n, D)
                    i += 1
            cache.append(k, v)
        return _Frame(keys, lengths, caches)

    def next_logits(self, batch: Sequence[Tokens]) -> torch.Tensor:
        """``(B, V)`` float32 next-token logits of each sequence, in batch order.

        A sequence the frame holds must have exactly one token more than at
        the last call (its newest, fed now); any other is prefilled.

        Raises:
            ValueError: an empty batch or an empty sequence.
        """
        if not batch or any(len(s.tokens) == 0 for s in batch):
            raise ValueError("next_logits needs at least one sequence, each non-empty")
        frame = self.frame
        wanted = {s.key: s for s in batch}
        rows = [r for r, key in enumerate(frame.keys)
                if key in wanted and len(wanted[key].tokens) == frame.lengths[r] + 1]  # fmt: skip
        if len(rows) < len(frame.keys) or (rows and frame.width + 1 > self.T):
            frame = self._reframe([(frame, rows)])  # drop rows that left; trim common pads
        found: list[torch.Tensor] = []  # (R, V) of the running rows, (J, V) of those joining
        if frame.keys:
            last = [wanted[key].tokens[-1] for key in frame.keys]
            ids = torch.tensor(last, device=self.device)[:, None]  # (R, 1)
            pads = self._pads(frame)  # (R,)
            frame.lengths = [n + 1 for n in frame.lengths]
            found.append(self._forward(ids, pads, frame.caches))  # (R, V)
        running = set(frame.keys)
        joining = [s for s in batch if s.key not in running]
        if joining:
            n = max(len(s.tokens) for s in joining)
            ids = torch.zeros(len(joining), n, dtype=torch.int64)  # (J, n), pads hold id 0
            for j, seq in enumerate(joining):
                ids[j, n - len(seq.tokens) :] = torch.tensor(list(seq.tokens))  # (len_j,)
            fresh = _Frame([s.key for s in joining], [len(s.tokens) for s in joining], [])
            pads = torch.tensor([n - length for length in fresh.lengths], device=self.device)
            fresh.caches = self._caches(len(joining))
            found.append(self._forward(ids.to(self.device), pads, fresh.caches))  # (J, V)
            everyone = list(range(len(frame.keys)))
            frame = self._reframe([(frame, everyone), (fresh, list(range(len(joining))))])
        self.frame = frame
        row = {key: r for r, key in enumerate(frame.keys)}  # running rows, then joining ones
        order = torch.tensor([row[s.key] for s in batch], device=self.device)  # (B,)
        return torch.cat(found)[order]  # (B, V)

    def release(self, key: int) -> None:
        """Nothing now: the next call drops the row (a copy of the others')."""
