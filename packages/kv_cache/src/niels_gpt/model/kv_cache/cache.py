"""Generation through per-layer KV caches: prefill once, then one token a step.

Shapes: B batch, t prompt length, n tokens in one cached call, p cache length
before it, H heads, D = C // H, T = cfg.T, V vocabulary. This stage sets the
attention stage's ``KVCache`` up on a model's modules and drops it, as
gpt-fast's and torchtune's ``setup_caches`` do; the model's own ``forward`` is
then the cached step. No module changes class, no attention maths is here.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from functools import partial
from typing import cast

import torch
from torch import nn

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, KVCache, attention_modules
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache._sampling import (
    check_generate_args,
    check_generator,
    check_knobs,
    choose_next,
    filter_logits,
)

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


class KVCacheAttention(CausalSelfAttention):
    """``CausalSelfAttention`` with an empty ``kv_cache`` slot (None); all else is the parent's."""

    kv_cache: KVCache | None

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.kv_cache = None


def _check_max_len(value: object, high: int) -> int:
    """``max_len``: an int (not a bool) in ``[1, high]``; the KVCache checks every size too."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise InputError(f"max_len must be an int in [1, cfg.T = {high}], got {value!r}")
    return value


def _attention_modules(model: nn.Module) -> list[CausalSelfAttention]:
    """Every attention module inside ``model``, in ``model.modules()`` order; each must run
    the one attention's ``forward`` (only that reads the cache), else ``InputError``
    (also for a ``model`` that is not an ``nn.Module``: the attention stage's walk)."""
    found = attention_modules(model)
    for name, module in found:
        if type(module).forward is not CausalSelfAttention.forward:
            raise InputError(
                f"{name or 'model'} is a {type(module).__name__} with a forward of its "
                "own; the KV cache needs the attention stage's forward"
            )
    return [module for _, module in found]


def use_kv_cache(model: nn.Module, batch_size: int, *, max_len: int | None = None) -> list[KVCache]:
    """Set up a fresh zero-filled ``KVCache`` on every attention module inside ``model``.

    ``model`` is a ``GPT``, a ``Block``, an attention module or any tree of
    them. Each module gets ``KVCache(batch_size, H_kv, max_len, D)`` (``max_len``
    defaults to its ``cfg.T``) in its parameters' dtype and device as its
    ``kv_cache``; nothing else changes (the same objects, classes, parameters,
    buffers, hooks and training flag). Calling it again is a reset.

    Returns:
        The caches, in ``model.modules()`` order (layer order for a ``GPT``).

    Raises:
        InputError (a ``TypeError``), before anything changes: ``model`` holds
            an attention module with a forward of its own or none at all, or
            ``batch_size``/``max_len`` is not an int in ``[1, cfg.T]``.
    """
    modules = _attention_modules(model)
    if not modules:
        raise InputError(f"{type(model).__name__} holds no attention module to cache")
    for m in modules:
        _check_max_len(m.cfg.T if max_len is None else max_len, m.cfg.T)
    caches = [
        KVCache(
            batch_size,
            m.n_kv_head,  # key/value heads: H, or H_kv under grouped-query attention
            m.cfg.T if max_len is None else max_len,
            m.head_dim,
            dtype=m.qkv.weight.dtype,
            device=m.qkv.weight.device,
        )
        for m in modules
    ]  # all allocated (the KVCache checks batch_size) before any module changes
    for module, cache in zip(modules, caches, strict=True):
        module.kv_cache = cache
    return caches


def _drop(module: CausalSelfAttention) -> None:
    """Take the cache away; a ``KVCacheAttention`` keeps its empty slot."""
    if isinstance(module, KVCacheAttention):
        module.kv_cache = None
    elif getattr(module, "kv_cache", None) is not None:
        del module.kv_cache  # leave no trace of the set-up


def drop_kv_cache(model: nn.Module) -> nn.Module:
    """Undo ``use_kv_cache`` in place and return ``model``: every module loses its cache.

    Raises:
        InputError: ``model`` is not an ``nn.Module``.
    """
    for _, module in attention_modules(model):
        _drop(module)
    return model


_Saved = list[tuple[CausalSelfAttention, "KVCache | None"]]


def _save(model: nn.Module) -> _Saved:
    """Each attention module with the cache the caller had set up on it (or None)."""
    return [(m, getattr(m, "kv_cache", None)) for _, m in attention_modules(model)]


def _restore(saved: _Saved) -> None:
    """Give every attention module back the cache it had (or none)."""
    for module, cache in saved:
        _drop(module)
        if cache is not None:
            module.kv_cache = cache


def _forward(
    model: GPT, x: torch.Tensor, trace_layer: int | None
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One cached forward of ``x`` ``(B, n)``: the ``(B, V)`` logits of its last position,
    and the ``(B, H, p+n)`` ``attn_row`` of ``trace_layer`` (None without one)."""
    if trace_layer is None:
        logits: torch.Tensor = model(x)  # (B, n, V)
        return logits[:, -1], None  # (B, V)
    logits, trace = model.forward_with_attn_trace(x, trace_layer)  # (B, n, V), trace
    return logits[:, -1], trace["attn_row"]  # (B, V), (B, H, p+n)


_Forward = Callable[[GPT, torch.Tensor, "int | None"], "tuple[torch.Tensor, torch.Tensor | None]"]


@functools.cache
def _compiled_forward(backend: str) -> _Forward:
    """``_forward`` through ``torch.compile(fullgraph=True)`` with ``backend``, made once
    per backend and process.

    One wrapper for every model: dynamo keeps its graphs on ``_forward``'s code
    and guards them on what they read (shapes, dtypes, the trace layer), so a
    later ``generate`` on a model of the same shape reuses them, and the
    growing cache length becomes a dynamic size after the first recompile
    instead of one graph per position.

    On a CPU, inductor's graphs are called through its C++ wrapper
    (``cpp_wrapper``): a one-token step runs about eighty kernels and GEMMs,
    and calling each from Python cost a decode step of the default model
    about a seventh of its time (90.1 against 105.7 tok/s, the fast path, one
    thread, the two wrappers interleaved in one process). Other devices and
    backends get ``torch.compile``'s defaults.
    """
    compiled = torch.compile(_forward, fullgraph=True, backend=backend)
    if backend != "inductor":
        return cast(_Forward, compiled)
    on_cpu = torch.compile(_forward, fullgraph=True, options={"cpp_wrapper": True})

    def forward(
        model: GPT, x: torch.Tensor, trace_layer: int | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        chosen = on_cpu if x.device.type == "cpu" else compiled
        return cast(_Forward, chosen)(model, x, trace_layer)

    return forward


def _compile_backend(value: object) -> str | None:
    """The ``torch.compile`` backend ``compile_step`` names: None for False (eager steps),
    ``"inductor"`` (torch.compile's default) for True, else a registered backend's name.

    Raises:
        InputError: not a bool or a backend dynamo knows (the message lists them).
    """
    if isinstance(value, bool):
        return "inductor" if value else None
    if isinstance(value, str):
        known = torch.compiler.list_backends(exclude_tags=())  # debug ones too: aot_eager
        if value in known:
            return value
        raise InputError(
            f"compile_step must be a bool or a torch.compile backend ({', '.join(known)}), "
            f"got {value!r}"
        )
    raise InputError(f"compile_step must be a bool or a backend name, got {value!r}")


def _decode(
    model: GPT,
    ids: torch.Tensor,
    t: int,
    knobs: tuple[float, int | None, float | None],
    eos_id: int | None,
    generator: torch.Generator | Sequence[torch.Generator] | None,
    trace_layer: int | None,
    step: _Forward,
) -> list[torch.Tensor]:
    """Fill ``ids[:, t:]`` of ``(B, t + new)`` ids on a model with caches; return the traces.

    The prefill runs ``_forward`` itself; every single-token step runs ``step``.
    """
    choose = partial(choose_next, temperature=knobs[0], top_k=knobs[1], top_p=knobs[2])
    traces: list[torch.Tensor] = []
    finished = torch.zeros_like(ids[:, 0], dtype=torch.bool)  # (B,)
    draws = torch.empty_like(ids[:, 0])  # (B,): per-row draws land here
    x = ids[:, :t]  # (B, t): step 0 is the prefill
    forward: _Forward = _forward  # the prefill's, eager: its length is the prompt's
    for col in range(t, ids.shape[1]):
        logits, trace = forward(model, x, trace_layer)  # (B, V), (B, H, col) or None
        if trace is not None:
            traces.append(trace.contiguous())  # (B, H, col), not a view of the prefill's
        forward = step
        token = choose(logits, generator=generator, draws=draws)  # (B,), finished rows drawn too
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
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    trace_layer: int | None = None,
    compile_step: bool | str = False,
) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
    """Continue ``prompt_ids`` by ``max_new_tokens`` tokens through per-layer KV caches.

    Step 0 is the prefill (one forward of the whole prompt), every later step
    one forward of the previous token alone; the caches (``B`` rows,
    ``t + max_new_tokens`` positions) are set up once, before the prefill, and
    dropped after. Decodes under ``torch.inference_mode`` (returning ordinary
    tensors) in the model's mode and hands the model back as it found it (the
    caller's caches, training flags, weights), on return or on an error.

    Args:
        model: a ``GPT`` whose attention is the attention stage's (any kernel).
        prompt_ids: ``(B, t)`` int64 ids in ``[0, V)`` on the model's device.
        max_new_tokens: ``>= 0`` with ``t + max_new_tokens <= cfg.T``.
        temperature, top_k, top_p: as in ``filter_logits``, applied in float32
            (float64 in a float64 model). Temperature 0 is the argmax and draws
            nothing; otherwise one ``torch.multinomial`` draw a step over all
            rows (finished ones too) from ``generator`` (the global one if None),
            or with ``B`` generators one a row, row ``b`` from ``generator[b]``.
        eos_id: a row that generates it is finished: it holds ``eos_id`` from
            then on (and is fed it); generation stops once every row has.
            Prompt tokens do not count.
        trace_layer: also return, per step ``i``, the ``(B, H, t + i)``
            ``attn_row`` of that layer, as ``forward_with_attn_trace`` gives it.
        compile_step: True runs every single-token step (not the prefill)
            through ``torch.compile(fullgraph=True)`` (inductor, which needs
            a C++ compiler on a CPU); a string names another backend
            (``"aot_eager"``: no toolchain). The same ids and traces up to the
            dtype's rounding, faster once compiled (the first call compiles,
            for tens of seconds on a CPU). A compile error is raised, never
            hidden by eager steps; so is dynamo's recompile limit, which a
            process reaches after about 8 model shapes.

    Returns:
        ``ids`` ``(B, t + max_new_tokens)`` int64 beginning with the prompt, or
        ``(ids, traces)`` when ``trace_layer`` is given.

    Raises:
        InputError: any argument out of its range, before any forward or cache set-up.
    """
    knobs = (temperature, top_k, top_p)
    check_generate_args(model, prompt_ids, max_new_tokens, knobs, eos_id, generator, trace_layer)
    backend = _compile_backend(compile_step)
    step = _forward if backend is None else _compiled_forward(backend)
    B, t = prompt_ids.shape
    ids = prompt_ids.new_empty(B, t + max_new_tokens)  # (B, t + new), filled as chosen
    ids[:, :t] = prompt_ids
    traces: list[torch.Tensor] = []
    if max_new_tokens > 0:
        saved = _save(model)
        try:
            with torch.inference_mode():  # ids is written in place, an ordinary tensor
                use_kv_cache(model, B, max_len=t + max_new_tokens)
                traces = _decode(model, ids, t, knobs, eos_id, generator, trace_layer, step)
        finally:
            _restore(saved)
        traces = [trace.clone() for trace in traces]  # ordinary tensors, out of inference mode
    if trace_layer is None:
        return ids
    return ids, traces


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
    """``generate`` with Hugging Face's result: stop once every row has produced ``eos_id``.

    The tokens are ``generate``'s with the same arguments. Returns ``(ids,
    lengths)``: ``ids`` ``(B, t + n)``, cut after the ``n <= max_new_tokens``
    steps that ran (rows padded with ``eos_id`` after their eos, as
    ``generate`` pads them); ``lengths`` ``(B,)`` int64, each row's prompt plus
    generated tokens up to and including its first ``eos_id`` (``t +
    max_new_tokens`` without one). Raises ``InputError``, before any forward,
    for an ``eos_id`` that is not an int and for what ``generate`` refuses.
    """
    if isinstance(eos_id, bool) or not isinstance(eos_id, int):
        raise InputError(f"eos_id must be a token id (an int), got {eos_id!r}")
    ids = generate(
        model,
        prompt_ids,
        max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        eos_id=eos_id,
        generator=generator,
    )
    ids = cast(torch.Tensor, ids)  # no trace_layer: the ids alone
    t = prompt_ids.shape[1]
    if ids.shape[1] == t:  # nothing asked for
        return ids, torch.full_like(ids[:, 0], t)  # (B,)
    ended = ids[:, t:] == eos_id  # (B, new)
    made = torch.where(ended.any(-1), ended.int().argmax(-1) + 1, ended.shape[1])  # (B,)
    lengths = t + made  # (B,) int64
    n = int(made.max())  # one host sync: the steps that ran
    return ids[:, : t + n].clone(), lengths
