"""Float64 reference of the kv_cache stage's public API (maintainer-owned).

The oracle's reference worker loads this file in place of both of the stage's
modules, ``niels_gpt.model.kv_cache`` and its private ``niels_gpt.model.kv_cache._sampling``
(nothing outside the stage imports the latter), for the calls ``reference_calls``
of ``specs/kv_cache.toml`` names. It is written from that spec's API comments
and seed 004, not from the stage's code:

- ``KVCache`` is the attention stage's class (the spec's ``same_as``), and the
  cached forward is the attention stage's one attention: ``use_kv_cache`` only
  sets a fresh zero-filled cache in the module's parameter dtype and device as
  the ``kv_cache`` of every module whose ``forward`` is attention's, and
  ``drop_kv_cache`` deletes those attributes.
- ``generate`` does not use a cache at all. Step ``i`` takes its logits from one
  uncached forward of the whole prefix ``ids[:, :t + i]`` (what the spec says a
  cached step equals) on a float64 copy of the model, so a cache that is wrong
  anywhere, in this stage or below it, shows. The logits are rounded to the
  model's dtype (what its forward promises) and promoted to float32 (float64 in
  a float64 model) as the spec's 2.3 says; argmax at temperature 0, otherwise
  ``torch.multinomial`` on the softmax of ``filter_logits``, one call on all
  rows a step, or one call a row with a list of generators. Traces are the
  float64 copy's ``forward_with_attn_trace`` rows of the same prefix.
- ``filter_logits`` keeps its values in the input dtype (the spec: computed in
  that dtype), and decides which entries top-p keeps from float64
  probabilities of those values with an exact stable ordering.

Every argument error is ``InputError``, raised before any forward, as the spec lists.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections.abc import Sequence
from typing import Any, TypeGuard

import torch
from torch import nn

from niels_gpt.checks import InputError
from niels_gpt.model.attention import CausalSelfAttention, KVCache
from niels_gpt.model.gpt import GPT

__all__ = [
    "KVCache",
    "KVCacheAttention",
    "check_generator",
    "check_knobs",
    "drop_kv_cache",
    "filter_logits",
    "generate",
    "generate_until_eos",
    "use_kv_cache",
]

NEG_INF = -math.inf


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


class KVCacheAttention(CausalSelfAttention):
    """The attention stage's attention built with an empty cache slot."""

    kv_cache: KVCache | None = None


# --- setting caches up --------------------------------------------------------


def _attention(model: nn.Module) -> list[CausalSelfAttention]:
    """Every attention module of ``model``, in ``model.modules()`` order; refuses
    one with a forward of its own and a tree without attention (TypeError)."""
    if not isinstance(model, nn.Module):
        raise InputError(f"model must be an nn.Module, got {type(model).__name__}")
    found = [m for m in model.modules() if isinstance(m, CausalSelfAttention)]
    if not found:
        raise InputError("model holds no attention module")
    for m in found:
        if type(m).forward is not CausalSelfAttention.forward:
            raise InputError(f"{type(m).__name__} has a forward of its own")
    return found


def use_kv_cache(model: nn.Module, batch_size: int, *, max_len: int | None = None) -> list[KVCache]:
    """Fresh ``(batch_size, H, max_len, D)`` caches on every attention module of ``model``."""
    if not _is_int(batch_size) or batch_size < 1:
        raise InputError(f"batch_size must be an int >= 1, got {batch_size!r}")
    found = _attention(model)
    for m in found:
        if max_len is not None and (not _is_int(max_len) or not 1 <= max_len <= m.cfg.T):
            raise InputError(f"max_len must be an int in [1, {m.cfg.T}], got {max_len!r}")
    caches = []
    for m in found:
        w = m.qkv.weight
        cache = KVCache(
            batch_size,
            m.n_head,
            m.cfg.T if max_len is None else max_len,
            m.head_dim,
            dtype=w.dtype,
            device=w.device,
        )
        m.kv_cache = cache
        caches.append(cache)
    return caches


def drop_kv_cache(model: nn.Module) -> nn.Module:
    """Delete every attention module's ``kv_cache`` attribute; returns ``model``."""
    for m in model.modules():
        if isinstance(m, CausalSelfAttention):
            with contextlib.suppress(AttributeError):  # none set up (a slot stays None)
                del m.kv_cache
    return model


# --- sampling -----------------------------------------------------------------


def check_knobs(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """The spec's knob ranges; InputError otherwise."""
    if not _is_real(temperature) or not math.isfinite(temperature) or temperature < 0:
        raise InputError(f"temperature must be a finite number >= 0, got {temperature!r}")
    if top_k is not None and (not _is_int(top_k) or top_k < 1):
        raise InputError(f"top_k must be None or an int >= 1, got {top_k!r}")
    if top_p is not None and (not _is_real(top_p) or not 0 < top_p <= 1):
        raise InputError(f"top_p must be None or a number in (0, 1], got {top_p!r}")


def check_generator(generator: object, batch: int, device: torch.device) -> None:
    """None, a generator on ``device``, or a list/tuple of ``batch`` of them."""
    many = generator if isinstance(generator, list | tuple) else None
    if many is not None and len(many) != batch:
        raise InputError(f"a list of generators must hold {batch}, got {len(many)}")
    for g in many if many is not None else ([] if generator is None else [generator]):
        if not isinstance(g, torch.Generator):
            raise InputError(f"generator must be a torch.Generator, got {type(g).__name__}")
        if torch.device(g.device).type != torch.device(device).type:
            raise InputError(f"generator must be on {device}, got {g.device}")


def filter_logits(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """The spec's four steps on ``(..., V)`` logits; a new tensor of the same dtype."""
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point() or logits.dim() < 1:
        raise InputError(f"logits must be a floating tensor with a dim, got {logits!r:.60}")
    check_knobs(temperature, top_k, top_p)
    v = logits.shape[-1]
    if temperature == 0:
        first = logits.argmax(dim=-1, keepdim=True)  # (..., 1)
        out = torch.full_like(logits, NEG_INF)  # (..., V)
        return out.scatter(-1, first, logits.gather(-1, first))
    values = logits / temperature  # (..., V), in the input's dtype
    keep = torch.ones_like(values, dtype=torch.bool)  # (..., V)
    if top_k is not None and top_k < v:
        kth = values.sort(dim=-1, descending=True).values[..., top_k - 1 : top_k]  # (..., 1)
        keep &= values >= kth
    if top_p is not None and top_p < 1:
        wide = values.double().masked_fill(~keep, NEG_INF)  # (..., V)
        probs = torch.softmax(wide, dim=-1)  # (..., V), float64
        # descending probability, ties by ascending index: sort on (-p, index) exactly
        order = torch.sort(-probs, dim=-1, stable=True).indices  # (..., V)
        ordered = probs.gather(-1, order)  # (..., V)
        before = torch.cumsum(ordered, dim=-1) - ordered  # (..., V): mass strictly before
        kept_sorted = before < top_p  # (..., V)
        keep &= torch.zeros_like(keep).scatter(-1, order, kept_sorted)
    return values.masked_fill(~keep, NEG_INF)


# --- generation ---------------------------------------------------------------


def _device(model: GPT) -> torch.device:
    return model.tok_emb.weight.device


def _check(
    model: object,
    prompt: object,
    new: object,
    knobs: tuple[Any, Any, Any],
    eos_id: object,
    generator: object,
    trace_layer: object,
) -> None:
    if not isinstance(model, GPT):
        raise InputError(f"model must be a GPT, got {type(model).__name__}")
    cfg, device = model.cfg, _device(model)
    if not isinstance(prompt, torch.Tensor) or prompt.dim() != 2 or prompt.dtype != torch.int64:
        raise InputError(f"prompt_ids must be a 2-D int64 tensor, got {prompt!r:.60}")
    if prompt.device != device or prompt.shape[0] < 1 or prompt.shape[1] < 1:
        raise InputError(f"prompt_ids must be (B>=1, t>=1) on {device}, got {prompt.shape}")
    if int(prompt.min()) < 0 or int(prompt.max()) >= cfg.V:
        raise InputError(f"prompt ids must be in [0, {cfg.V})")
    if not _is_int(new) or new < 0:
        raise InputError(f"max_new_tokens must be an int >= 0, got {new!r}")
    if prompt.shape[1] + new > cfg.T:
        raise InputError(f"t + max_new_tokens must be <= {cfg.T}")
    check_knobs(*knobs)
    if eos_id is not None and (not _is_int(eos_id) or not 0 <= eos_id < cfg.V):
        raise InputError(f"eos_id must be None or an int in [0, {cfg.V}), got {eos_id!r}")
    check_generator(generator, prompt.shape[0], device)
    if trace_layer is not None and (not _is_int(trace_layer) or not 0 <= trace_layer < cfg.L):
        raise InputError(f"trace_layer must be None or an int in [0, {cfg.L}), got {trace_layer!r}")


def _exact_copy(model: GPT) -> GPT:
    """A float64 copy of ``model`` with no cache set up (the caller's model is untouched)."""
    twin = copy.deepcopy(model).double()
    drop_kv_cache(twin)
    return twin


def _choose(
    logits: torch.Tensor,
    knobs: tuple[float, int | None, float | None],
    generator: torch.Generator | Sequence[torch.Generator] | None,
) -> torch.Tensor:
    """The next token of each row from ``(B, V)`` logits: ``(B,)`` int64."""
    temperature, top_k, top_p = knobs
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    probs = torch.softmax(
        filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p), dim=-1
    )  # (B, V)
    if isinstance(generator, list | tuple):
        rows = [
            torch.multinomial(probs[b : b + 1], 1, generator=g) for b, g in enumerate(generator)
        ]
        return torch.cat(rows)[:, 0]  # (B,)
    one = generator if isinstance(generator, torch.Generator) else None
    return torch.multinomial(probs, num_samples=1, generator=one)[:, 0]  # (B,)


def _run(
    model: GPT,
    prompt: torch.Tensor,
    new: int,
    knobs: tuple[float, int | None, float | None],
    eos_id: int | None,
    generator: Any,
    trace_layer: int | None,
) -> tuple[torch.Tensor, list[torch.Tensor], int]:
    """The spec's generation, uncached: ``(ids (B, t + new), traces, steps run)``."""
    b, t = prompt.shape
    dtype = model.tok_emb.weight.dtype
    sample_dtype = torch.promote_types(dtype, torch.float32)
    trace_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    ids = torch.empty(b, t + new, dtype=torch.int64, device=prompt.device)  # (B, t + new)
    ids[:, :t] = prompt
    traces: list[torch.Tensor] = []
    if new == 0:
        return ids, traces, 0
    twin = _exact_copy(model)
    finished = torch.zeros(b, dtype=torch.bool, device=prompt.device)  # (B,)
    steps = 0
    with torch.no_grad():
        for i in range(new):
            col = t + i
            prefix = ids[:, :col]  # (B, col)
            if trace_layer is None:
                exact = twin(prefix)[:, -1]  # (B, V) float64
            else:
                out, trace = twin.forward_with_attn_trace(prefix, trace_layer)
                exact = out[:, -1]  # (B, V) float64
                traces.append(trace["attn_row"].to(trace_dtype).clone())  # (B, H, col)
            steps += 1
            logits = exact.to(dtype).to(sample_dtype)  # (B, V)
            token = _choose(logits, knobs, generator)  # (B,)
            if eos_id is not None:
                token = torch.where(finished, torch.full_like(token, eos_id), token)
                finished |= token == eos_id
            ids[:, col] = token
            if eos_id is not None and bool(finished.all()):
                ids[:, col + 1 :] = eos_id
                break
    return ids, traces, steps


def generate(
    model: GPT,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    trace_layer: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
    """``(B, t + max_new_tokens)`` ids, or ``(ids, traces)`` with ``trace_layer``."""
    knobs = (temperature, top_k, top_p)
    _check(model, prompt_ids, max_new_tokens, knobs, eos_id, generator, trace_layer)
    ids, traces, _ = _run(model, prompt_ids, max_new_tokens, knobs, eos_id, generator, trace_layer)
    return ids if trace_layer is None else (ids, traces)


def generate_until_eos(
    model: GPT,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    *,
    eos_id: int,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """generate's tokens cut after the last step run, and each row's length
    up to and including its first eos (``t + max_new_tokens`` without one)."""
    if not _is_int(eos_id):
        raise InputError(f"eos_id must be an int, got {eos_id!r}")
    knobs = (temperature, top_k, top_p)
    _check(model, prompt_ids, max_new_tokens, knobs, eos_id, generator, None)
    ids, _, steps = _run(model, prompt_ids, max_new_tokens, knobs, eos_id, generator, None)
    t = prompt_ids.shape[1]
    made = ids[:, t : t + steps]  # (B, steps)
    ended = made == eos_id  # (B, steps)
    first = torch.where(ended.any(-1), ended.int().argmax(-1) + 1, max_new_tokens)  # (B,)
    return ids[:, : t + steps].clone(), (t + first).to(torch.int64)
