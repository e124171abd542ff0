"""The decoders ``benchmarks.decode`` times, beside the kv_cache stage's ``generate``.

- ``SdpaDecoder``: a compact greedy decoder on a ``GPT``'s weights with its own
  static cache and ``scaled_dot_product_attention`` (what plain PyTorch gives
  without the stage's explicit attention core and its checks);
- ``StaticDecoder``: the same decoder written as gpt-fast writes it for
  ``torch.compile``: positions as a tensor, attention over the whole cache
  under a mask, so a one-token step has one shape and compiles to one graph;
- ``recompute_loop``: greedy decoding without a cache;
- ``step_loop``: greedy decoding written out over the stage's cache, so one
  step (eager or compiled) can be swapped in and timed on the same positions;
- ``rewind``: reuse a stage cache from a given length, bench-only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import cast

import torch
import torch.nn.functional as F

from niels_gpt.model.blocks import Block
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import KVCache

Step = Callable[[torch.Tensor], torch.Tensor]


def _static_cache(
    model: GPT, batch: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor]:
    """A static cache's keys and values, ``(B, H, T, D)`` zeros per layer in the model's
    dtype and device, and RoPE's angles ``(T, D/2)`` float64 (one per adjacent pair)."""
    cfg = model.cfg
    w = model.tok_emb.weight
    D = cfg.C // cfg.H
    shape = (batch, cfg.H, cfg.T, D)
    keys = [w.new_zeros(shape) for _ in model.blocks]  # L x (B, H, T, D)
    values = [w.new_zeros(shape) for _ in model.blocks]  # L x (B, H, T, D)
    inv_freq = cfg.rope_theta ** (-2.0 * torch.arange(D // 2, dtype=torch.float64) / D)
    angles = torch.arange(cfg.T, dtype=torch.float64)[:, None] * inv_freq  # (T, D/2)
    return keys, values, angles


class SdpaDecoder:
    """GPT v1 greedy decoding with a static cache and SDPA, on ``model``'s weights.

    Norms, MLPs, embedding and head are the model's own modules; attention,
    RoPE (a complex turn per adjacent channel pair) and the cache, allocated
    once as ``(B, H, T, D)`` per layer, are written here.
    """

    def __init__(self, model: GPT, batch: int) -> None:
        self.model = model
        w = model.tok_emb.weight
        self.keys, self.values, angles = _static_cache(model, batch)
        turns = torch.polar(torch.ones_like(angles), angles)  # (T, D/2) complex128
        self.turns = turns.to(device=w.device, dtype=torch.complex64)  # (T, D/2)

    def _rotate(self, x: torch.Tensor, p: int) -> torch.Tensor:
        n = x.shape[2]
        z = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))  # (B, H, n, D/2)
        return torch.view_as_real(z * self.turns[p : p + n]).flatten(-2)  # (B, H, n, D)

    def forward(self, ids: torch.Tensor, p: int) -> torch.Tensor:
        """Logits ``(B, n, V)`` of ``ids`` ``(B, n)`` at positions ``p .. p+n-1``.

        A prefill (``p = 0``) or one token (``n = 1``); rows ``[p, p+n)`` of
        the cache are (re)written, so a call at the same ``p`` can repeat.
        """
        m = self.model
        B, n = ids.shape
        assert p == 0 or n == 1, "a chunk after the prefill is not supported here"
        h = m.tok_emb(ids)  # (B, n, C)
        for i, block in enumerate(cast(list[Block], list(m.blocks))):
            attn = block.attn
            H, D = attn.n_head, attn.head_dim
            q, k, v = attn.qkv(block.ln1(h)).split(h.shape[-1], dim=-1)  # (B, n, C) each
            q, k, v = (z.view(B, n, H, D).transpose(1, 2) for z in (q, k, v))  # (B, H, n, D)
            self.keys[i][:, :, p : p + n] = self._rotate(k, p)  # (B, H, n, D) into the cache
            self.values[i][:, :, p : p + n] = v  # (B, H, n, D) into the cache
            out = F.scaled_dot_product_attention(
                self._rotate(q, p),
                self.keys[i][:, :, : p + n],
                self.values[i][:, :, : p + n],
                is_causal=n > 1,
            )  # (B, H, n, D)
            h = h + attn.proj(out.transpose(1, 2).reshape(B, n, -1))  # (B, n, C)
            h = h + block.mlp(block.ln2(h))  # (B, n, C)
        logits: torch.Tensor = m.lm_head(m.ln_f(h))  # (B, n, V)
        return logits

    def greedy(self, prompt: torch.Tensor, new: int) -> torch.Tensor:
        """``(B, t + new)`` ids: ``prompt`` ``(B, t)`` and its greedy continuation."""
        ids = prompt.new_empty(prompt.shape[0], prompt.shape[1] + new)  # (B, t + new)
        ids[:, : prompt.shape[1]] = prompt
        x, p = prompt, 0
        for col in range(prompt.shape[1], ids.shape[1]):
            ids[:, col] = self.forward(x, p)[:, -1].argmax(-1)  # (B,)
            p += x.shape[1]
            x = ids[:, col : col + 1]  # (B, 1)
        return ids


class StaticDecoder:
    """gpt-fast's decoder on ``model``'s weights: fixed shapes, so one graph a step.

    The cache is ``(B, H, T, D)`` per layer, allocated once; a call writes the
    rows of its positions (``index_copy_``) and attends to all ``T`` rows under
    a causal mask indexed by the positions, and RoPE turns adjacent channel
    pairs by cos/sin tables (real arithmetic: inductor compiles no complex
    numbers). Norms, linears, MLPs, embedding and head are the model's own
    modules. ``torch.compile(decoder.step, fullgraph=True)`` is gpt-fast's
    recipe; ``greedy(..., step=compiled)`` runs the prefill eagerly and every
    one-token step through it.
    """

    def __init__(self, model: GPT, batch: int) -> None:
        cfg = model.cfg
        self.model = model
        w = model.tok_emb.weight
        self.keys, self.values, angles = _static_cache(model, batch)
        self.cos = angles.cos().to(device=w.device, dtype=torch.float32)  # (T, D/2)
        self.sin = angles.sin().to(device=w.device, dtype=torch.float32)  # (T, D/2)
        ones = torch.ones(cfg.T, cfg.T, dtype=torch.bool, device=w.device)  # (T, T)
        self.causal = ones.tril()  # (T, T): row p sees columns 0..p

    def _rotate(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        c, s = self.cos[pos], self.sin[pos]  # (n, D/2) each
        a, b = x.float().view(*x.shape[:-1], -1, 2).unbind(-1)  # (B, H, n, D/2) each
        turned = torch.stack((a * c - b * s, a * s + b * c), dim=-1)  # (B, H, n, D/2, 2)
        return turned.flatten(-2).to(x.dtype)  # (B, H, n, D)

    def step(self, ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Logits ``(B, n, V)`` of ``ids`` ``(B, n)`` at positions ``pos`` ``(n,)`` int64."""
        m = self.model
        B, n = ids.shape
        mask = self.causal[pos]  # (n, T)
        h = m.tok_emb(ids)  # (B, n, C)
        for i, block in enumerate(cast(list[Block], list(m.blocks))):
            attn = block.attn
            H, D = attn.n_head, attn.head_dim
            q, k, v = attn.qkv(block.ln1(h)).split(h.shape[-1], dim=-1)  # (B, n, C) each
            q, k, v = (z.view(B, n, H, D).transpose(1, 2) for z in (q, k, v))  # (B, H, n, D)
            self.keys[i].index_copy_(2, pos, self._rotate(k, pos))  # rows pos of (B, H, T, D)
            self.values[i].index_copy_(2, pos, v)  # rows pos of (B, H, T, D)
            out = F.scaled_dot_product_attention(
                self._rotate(q, pos), self.keys[i], self.values[i], attn_mask=mask
            )  # (B, H, n, D)
            h = h + attn.proj(out.transpose(1, 2).reshape(B, n, -1))  # (B, n, C)
            h = h + block.mlp(block.ln2(h))  # (B, n, C)
        logits: torch.Tensor = m.lm_head(m.ln_f(h))  # (B, n, V)
        return logits

    def greedy(
        self,
        prompt: torch.Tensor,
        new: int,
        step: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    ) -> torch.Tensor:
        """``(B, t + new)`` ids; the prefill eager, the one-token steps through ``step``."""
        one = step or self.step
        t = prompt.shape[1]
        ids = prompt.new_empty(prompt.shape[0], t + new)  # (B, t + new)
        ids[:, :t] = prompt
        where = torch.arange(t + new, device=prompt.device)  # (t + new,) int64
        ids[:, t] = self.step(prompt, where[:t])[:, -1].argmax(-1)  # (B,): the prefill's
        for col in range(t + 1, t + new):
            x = ids[:, col - 1 : col]  # (B, 1)
            ids[:, col] = one(x, where[col - 1 : col])[:, -1].argmax(-1)  # (B,)
        return ids


def recompute_loop(model: GPT, prompt: torch.Tensor, new: int) -> torch.Tensor:
    """Greedy ``(B, t + new)`` ids without a cache: the whole prefix through ``GPT.forward``."""
    ids = prompt.new_empty(prompt.shape[0], prompt.shape[1] + new)  # (B, t + new)
    ids[:, : prompt.shape[1]] = prompt
    for col in range(prompt.shape[1], ids.shape[1]):
        ids[:, col] = model(ids[:, :col])[:, -1].argmax(-1)  # (B,)
    return ids


def rewind(caches: list[KVCache], p: int) -> None:
    """Set every cache's length to ``p`` (rows ``[0, p)`` must hold those positions).

    Bench-only: the stage resets a cache by allocating a new one, and a fresh
    cache object would make a compiled step re-check its guards (or recompile).
    """
    for cache in caches:
        cache._filled = cache.keys[:, :, :p]  # (B, H, p, D) view, as the stage keeps it


def step_loop(
    step: Step, model: GPT, caches: list[KVCache], prompt: torch.Tensor, new: int
) -> Callable[[], torch.Tensor]:
    """A greedy run of ``new >= 1`` tokens after ``prompt`` ``(B, t)`` on ``caches``.

    ``caches`` are those attached to ``model`` by ``use_kv_cache``; each run
    rewinds them, prefills eagerly with ``model``, then calls ``step`` (the
    model itself or a compiled ``model``) on one token at a time. The run
    returns ``(B, t + new)`` ids.
    """
    t = prompt.shape[1]

    def run() -> torch.Tensor:
        rewind(caches, 0)
        ids = prompt.new_empty(prompt.shape[0], t + new)  # (B, t + new)
        ids[:, :t] = prompt
        ids[:, t] = model(prompt)[:, -1].argmax(-1)  # (B,): the prefill's token
        for col in range(t + 1, t + new):
            ids[:, col] = step(ids[:, col - 1 : col])[:, -1].argmax(-1)  # (B,)
        return ids

    return run
