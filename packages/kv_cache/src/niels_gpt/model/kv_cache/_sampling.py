"""The knobs of ``generate``: their checks, ``filter_logits`` and the draw.

Shape notation::

    B: rows (batch), t: prompt length, V: vocabulary; ``...`` any leading dims

Private home of what ``niels_gpt.model.kv_cache`` re-exports as
``filter_logits``, and of every argument check ``generate`` runs before it
touches the model. The order of the filters is fixed: divide by the
temperature, keep the top-k entries (ties at the k-th value included), then the
shortest most-probable prefix whose mass reaches top-p. The draw is pinned to
``torch.multinomial`` on the softmax of the filtered logits, one call for all
rows (or, with a generator a row, one call a row in row order), so seeded
generators reproduce a run exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from niels_gpt.checks import InputError, is_index
from niels_gpt.model.gpt import GPT

__all__ = ["check_generate_args", "check_generator", "check_knobs", "choose_next", "filter_logits"]

NEG_INF = float("-inf")


def _is_real(value: object) -> bool:
    """An int or float, but not a bool (``True`` is an int to Python, never a knob value)."""
    return not isinstance(value, bool) and isinstance(value, (int, float))


def check_knobs(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """Raise ``InputError`` unless every knob is in its documented range.

    ``temperature``: a finite float (or int) ``>= 0``; ``top_k``: ``None`` or an
    int ``>= 1``; ``top_p``: ``None`` or a float in ``(0, 1]``. ``bool`` is
    refused everywhere.
    """
    if not _is_real(temperature) or not (math.isfinite(temperature) and temperature >= 0):
        raise InputError(
            f"temperature must be a finite float >= 0, got {type(temperature).__name__} "
            f"{temperature!r}"
        )
    if top_k is not None and not is_index(top_k, 1, None):
        raise InputError(f"top_k must be None or an int >= 1, got {type(top_k).__name__} {top_k!r}")
    if top_p is not None and (not _is_real(top_p) or not 0.0 < top_p <= 1.0):
        raise InputError(
            f"top_p must be None or a float in (0, 1], got {type(top_p).__name__} {top_p!r}"
        )


def _check_logits(logits: torch.Tensor) -> None:
    if not isinstance(logits, torch.Tensor):
        raise InputError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if not logits.dtype.is_floating_point:
        raise InputError(f"logits must be a floating tensor, got {logits.dtype}")
    if logits.ndim < 1 or logits.shape[-1] < 1:
        raise InputError(
            f"logits must have a vocabulary dim of size >= 1 (..., V), got shape "
            f"{tuple(logits.shape)}"
        )


def _first_max_only(logits: torch.Tensor) -> torch.Tensor:
    """Each row's first maximal entry, unscaled; every other entry ``-inf``."""
    best = logits.argmax(dim=-1, keepdim=True)  # (..., 1), the first maximum
    out = torch.full_like(logits, NEG_INF)  # (..., V)
    return out.scatter_(-1, best, logits.gather(-1, best))  # (..., V)


def _top_p_drop(scaled: torch.Tensor, top_p: float) -> torch.Tensor:
    """Entries past the shortest most-probable prefix whose mass reaches ``top_p``.

    Rows are ordered by descending probability, ties by ascending index (a
    stable sort); an entry is dropped iff the mass strictly before it is
    ``>= top_p``, so the entry that crosses ``top_p`` stays.
    """
    probs = torch.softmax(scaled, dim=-1)  # (..., V), filtered entries at 0
    ordered, order = torch.sort(probs, dim=-1, descending=True, stable=True)  # (..., V) each
    before = torch.zeros_like(ordered)  # (..., V): mass strictly before each entry
    before[..., 1:] = torch.cumsum(ordered[..., :-1], dim=-1)  # (..., V - 1)
    drop_ordered = before >= top_p  # (..., V) in sorted order
    return torch.zeros_like(drop_ordered).scatter_(-1, order, drop_ordered)  # (..., V)


def _filter(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> torch.Tensor:
    """``filter_logits`` without the argument checks (``generate`` checks once)."""
    if temperature == 0:
        return _first_max_only(logits)  # top_k and top_p cannot move an argmax
    scaled = logits / temperature  # (..., V), a new tensor in the logits' dtype
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]  # (..., 1), the k-th largest
        scaled = scaled.masked_fill_(scaled < kth, NEG_INF)  # (..., V), ties at kth stay
    if top_p is not None and top_p < 1.0:
        scaled = scaled.masked_fill_(_top_p_drop(scaled, top_p), NEG_INF)  # (..., V)
    return scaled


def filter_logits(
    logits: torch.Tensor,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
) -> torch.Tensor:
    """Scale and filter next-token logits the way ``generate`` samples from them.

    Args:
        logits: ``(..., V)`` floating; every leading index is one row.
        temperature: ``> 0`` divides every entry; ``0`` keeps only each row's
            first maximum, unscaled, and ignores ``top_k`` and ``top_p``.
        top_k: keep the entries ``>=`` the row's k-th largest value (ties at it
            all stay); ``None`` or ``top_k >= V`` keeps everything.
        top_p: of what top-k kept, keep the shortest most-probable prefix whose
            probability mass reaches ``top_p`` (order: descending probability,
            ties by ascending index); ``None`` or ``1.0`` keeps everything.

    Returns:
        A new ``(..., V)`` tensor in the dtype and on the device of ``logits``
        (which is not modified): kept entries hold ``logits / temperature``,
        the others ``-inf``.

    Raises:
        InputError: ``logits`` is not a floating tensor with a vocabulary dim,
            or a knob is out of range (see ``check_knobs``).
    """
    _check_logits(logits)
    check_knobs(temperature, top_k, top_p)
    return _filter(logits, temperature, top_k, top_p)


def choose_next(
    logits: torch.Tensor,
    *,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    generator: torch.Generator | Sequence[torch.Generator] | None,
    draws: torch.Tensor | None = None,
) -> torch.Tensor:
    """The next token of every row from its ``(B, V)`` last-position logits.

    Temperature 0 is the argmax (the first maximum) and draws nothing;
    otherwise one ``torch.multinomial`` call over all ``B`` rows on the softmax
    of the filtered logits, filtered and drawn in float32 (float64 for float64
    logits), with ``generator`` (the global one when ``None``). With a list or
    tuple of ``B`` generators, row ``b`` is drawn from ``generator[b]`` alone,
    one call a row in row order, into ``draws`` (``(B,)`` int64, allocated
    here when ``None``). Knobs are not checked here. Returns ``(B,)`` int64.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)  # (B,)
    # float32 whatever the model's dtype: a half model's logits / 1e-4 overflow in half
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # (B, V)
    probs = torch.softmax(_filter(logits, temperature, top_k, top_p), dim=-1)  # (B, V)
    if generator is not None and not isinstance(generator, torch.Generator):  # one a row
        rows = probs.new_empty(probs.shape[0], dtype=torch.int64) if draws is None else draws
        for b, gen in enumerate(generator):
            rows[b] = torch.multinomial(probs[b : b + 1], num_samples=1, generator=gen)[0, 0]
        return rows  # (B,)
    return torch.multinomial(probs, num_samples=1, generator=generator)[:, 0]  # (B,)


def _same_device(a: torch.device, b: torch.device) -> bool:
    """Equal devices, reading a missing index as 0 (``cuda`` is ``cuda:0``)."""
    return a.type == b.type and (a.index or 0) == (b.index or 0)


def _check_prompt(model: GPT, prompt_ids: torch.Tensor) -> None:
    device, V = model.tok_emb.weight.device, model.cfg.V
    if not isinstance(prompt_ids, torch.Tensor):
        raise InputError(f"prompt_ids must be a torch.Tensor, got {type(prompt_ids).__name__}")
    if prompt_ids.ndim != 2 or prompt_ids.shape[0] < 1 or prompt_ids.shape[1] < 1:
        raise InputError(
            f"prompt_ids must be 2-D (B, t) with B >= 1 and t >= 1, got shape "
            f"{tuple(prompt_ids.shape)}"
        )
    if prompt_ids.dtype != torch.int64:
        raise InputError(f"prompt_ids must hold int64 token ids, got {prompt_ids.dtype}")
    if prompt_ids.device != device:
        raise InputError(
            f"prompt_ids must be on the model's device {device}, got {prompt_ids.device}"
        )
    lo, hi = int(prompt_ids.min()), int(prompt_ids.max())  # one sync, before any work
    if lo < 0 or hi >= V:
        raise InputError(f"token ids must be in [0, {V - 1}] (cfg.V={V}), got min {lo}, max {hi}")


def check_generator(generator: object, batch: int, device: torch.device) -> None:
    """Require None, a ``torch.Generator`` on ``device``, or a list or tuple of ``batch`` of them.

    Raises:
        InputError: anything else, naming the expected and the actual value.
    """
    if generator is None:
        return
    if isinstance(generator, (list, tuple)):
        if len(generator) != batch:
            raise InputError(
                f"a generator list must hold one torch.Generator per row ({batch}), "
                f"got {len(generator)}"
            )
        for i, gen in enumerate(generator):
            if not (isinstance(gen, torch.Generator) and _same_device(gen.device, device)):
                got = gen.device if isinstance(gen, torch.Generator) else type(gen).__name__
                raise InputError(f"generator[{i}] must be a torch.Generator on {device}, got {got}")
        return
    if not (isinstance(generator, torch.Generator) and _same_device(generator.device, device)):
        found = generator.device if isinstance(generator, torch.Generator) else generator
        raise InputError(
            f"generator must be None, a torch.Generator on {device} or a list of {batch}, "
            f"got {found!r}"
        )


def check_generate_args(
    model: GPT,
    prompt_ids: torch.Tensor,
    max_new_tokens: int,
    knobs: tuple[float, int | None, float | None],
    eos_id: int | None,
    generator: torch.Generator | Sequence[torch.Generator] | None,
    trace_layer: int | None,
) -> None:
    """Every check ``generate`` runs before any forward; ``knobs`` is ``(temperature,
    top_k, top_p)``. Raises ``InputError`` naming the expected and the actual value.
    """
    if not isinstance(model, GPT):
        raise InputError(f"model must be a niels_gpt GPT, got {type(model).__name__}")
    _check_prompt(model, prompt_ids)
    if not is_index(max_new_tokens, 0, None):
        raise InputError(
            f"max_new_tokens must be an int >= 0, got {type(max_new_tokens).__name__} "
            f"{max_new_tokens!r}"
        )
    t, T = prompt_ids.shape[1], model.cfg.T
    if t + max_new_tokens > T:
        raise InputError(
            f"prompt length t + max_new_tokens must be <= cfg.T = {T}, got "
            f"{t} + {max_new_tokens} = {t + max_new_tokens}"
        )
    check_knobs(*knobs)
    V, L = model.cfg.V, len(model.blocks)
    if eos_id is not None and not is_index(eos_id, 0, V):
        raise InputError(f"eos_id must be None or a token id in [0, {V - 1}], got {eos_id!r}")
    check_generator(generator, prompt_ids.shape[0], model.tok_emb.weight.device)
    if trace_layer is not None and not is_index(trace_layer, 0, L):
        raise InputError(f"trace_layer must be None or an int in [0, {L - 1}], got {trace_layer!r}")
