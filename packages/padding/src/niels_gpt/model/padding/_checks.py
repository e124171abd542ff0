"""Every argument check of the padding stage, run before any work.

Shapes: B batch, t padded length, n tokens in one call, H heads, D head dim, V
vocabulary, T = cfg.T, L layers. Each check raises ``niels_gpt.checks.InputError``
naming the expected and the actual value; nothing is cast. Values (a mask's
layout, the id range) are read with one host sync each, before any forward.
"""

from __future__ import annotations

import torch

from niels_gpt.checks import InputError, check_length, is_index
from niels_gpt.model.attention import CausalSelfAttention, attention_modules
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import check_generator, check_knobs

__all__ = [
    "check_generate_args",
    "check_loss_args",
    "check_mask",
    "check_model",
    "check_rope_rows",
    "check_tokens",
    "check_trace_layer",
]


def check_model(model: object) -> GPT:
    """Require a ``GPT`` whose attention modules run the attention stage's forward (any
    kernel) with no KV cache set up; a forward of its own or a cache is refused."""
    if not isinstance(model, GPT):
        raise InputError(f"model must be a niels_gpt GPT, got {type(model).__name__}")
    for name, module in attention_modules(model):
        if type(module).forward is not CausalSelfAttention.forward:
            raise InputError(
                f"{name} must run the attention stage's forward, got a "
                f"{type(module).__name__} with its own (call kv_cache.drop_kv_cache first "
                "if it holds a cache)"
            )
        if getattr(module, "kv_cache", None) is not None:
            raise InputError(
                f"{name} must have no KV cache set up, got one (call kv_cache.drop_kv_cache first)"
            )
    return model


def check_tokens(model: GPT, ids: object, name: str) -> torch.Tensor:
    """Require ``(B, t)`` int64 ids in ``[0, V)`` on the model's device, ``1 <= t <= limit``.

    ``B >= 1``. Returns the ids.
    """
    if not isinstance(ids, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor of token ids, got {type(ids).__name__}")
    if ids.ndim != 2 or ids.shape[0] < 1:
        raise InputError(f"{name} must be 2-D (B, t) with B >= 1, got shape {tuple(ids.shape)}")
    if ids.dtype != torch.int64:
        raise InputError(f"{name} must hold int64 token ids, got {ids.dtype}")
    device = model.tok_emb.weight.device
    if ids.device != device:
        raise InputError(f"{name} device must be the model's ({device}), got {ids.device}")
    check_length(ids.shape[1], model.cfg.T, f"{name} length t")
    V = model.cfg.V
    lo, hi = int(ids.min()), int(ids.max())  # one host sync, before any work
    if lo < 0 or hi >= V:
        raise InputError(f"{name} must be in [0, {V - 1}] (cfg.V={V}), got min {lo}, max {hi}")
    return ids


def check_mask(
    mask: object, like: torch.Tensor, what: str, *, need_real: bool = False
) -> torch.Tensor | None:
    """Require ``None`` or a left-padded ``(B, t)`` bool mask shaped and placed like ``like``.

    Left-padded: each row is some False (pads), then only True (real tokens).
    ``need_real``: every row also needs a real token (generation continues
    from it). Returns the mask. A bad row is named as ``row <b>``, the first.
    """
    if mask is None:
        return None
    name = "attention_mask"
    if not isinstance(mask, torch.Tensor):
        raise InputError(f"{name} must be None or a torch.Tensor, got {type(mask).__name__}")
    if mask.dtype != torch.bool:
        raise InputError(f"{name} must have dtype torch.bool, got {mask.dtype}")
    if mask.shape != like.shape:
        raise InputError(
            f"{name} shape must be {what}'s {tuple(like.shape)}, got {tuple(mask.shape)}"
        )
    if mask.device != like.device:
        raise InputError(f"{name} device must be {what}'s ({like.device}), got {mask.device}")
    if mask.numel() == 0:
        return mask
    right = (mask[:, :-1] & ~mask[:, 1:]).any(dim=-1)  # (B,) a False after a True
    if bool(right.any()):  # a host sync, before any work
        row = int(right.int().argmax())
        raise InputError(
            f"{name} must be left-padded (pads first, then only real tokens), got a pad "
            f"after a real token in row {row}"
        )
    if need_real:
        empty = ~mask[:, -1]  # (B,): left-padded, so a row with no real token ends in a pad
        if bool(empty.any()):
            row = int(empty.int().argmax())
            raise InputError(f"{name} must have a real token in every row, got none in row {row}")
    return mask


def check_trace_layer(trace_layer: object, n_layers: int) -> None:
    """Require ``None`` or an int (not bool) in ``[0, n_layers)``."""
    if trace_layer is not None and not is_index(trace_layer, 0, n_layers):
        raise InputError(
            f"trace_layer must be None or an int in [0, {n_layers - 1}], got "
            f"{type(trace_layer).__name__} {trace_layer!r}"
        )


def _tensor(value: object, name: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise InputError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_rope_rows(
    q_in: object, k_in: object, sin_in: object, cos_in: object, positions_in: object
) -> None:
    """The inputs of ``apply_rope_rows``: q, k ``(B, H, n, D)``; sin, cos ``(1, 1, Tc, D/2)``;
    positions ``(B, n)`` int64 in ``[0, Tc)``, all on q's device (one host sync)."""
    q, k = _tensor(q_in, "q"), _tensor(k_in, "k")
    sin, cos = _tensor(sin_in, "sin"), _tensor(cos_in, "cos")
    positions = _tensor(positions_in, "positions")
    if q.ndim != 4 or q.shape[0] < 1 or q.shape[2] < 1:
        raise InputError(f"q must be 4-D (B, H, n, D) with B, n >= 1, got shape {tuple(q.shape)}")
    if not q.dtype.is_floating_point:
        raise InputError(f"q must be floating point, got {q.dtype}")
    if (k.shape, k.dtype, k.device) != (q.shape, q.dtype, q.device):
        raise InputError(
            f"k must match q's shape, dtype and device ({tuple(q.shape)}, {q.dtype}, "
            f"{q.device}), got ({tuple(k.shape)}, {k.dtype}, {k.device})"
        )
    B, _, n, D = q.shape
    if D % 2 != 0:
        raise InputError(f"head dim D must be even (channels rotate in pairs), got D={D}")
    for name, table in (("sin", sin), ("cos", cos)):
        if table.ndim != 4 or table.shape[:2] != (1, 1) or table.shape[2] < 1:
            raise InputError(
                f"{name} must be (1, 1, Tc, D/2) with Tc >= 1, got {tuple(table.shape)}"
            )
        if table.shape != sin.shape or table.shape[3] != D // 2:
            raise InputError(
                f"sin and cos must both be (1, 1, Tc, {D // 2}), got {tuple(sin.shape)} "
                f"and {tuple(cos.shape)}"
            )
        if table.dtype != q.dtype or table.device != q.device:
            raise InputError(
                f"{name} must be in q's dtype and on its device ({q.dtype}, {q.device}), "
                f"got ({table.dtype}, {table.device})"
            )
    if (positions.shape, positions.dtype) != ((B, n), torch.int64):
        raise InputError(
            f"positions must be ({B}, {n}) int64, got {tuple(positions.shape)} {positions.dtype}"
        )
    if positions.device != q.device:
        raise InputError(f"positions must be on q's device {q.device}, got {positions.device}")
    Tc = sin.shape[2]
    lo, hi = int(positions.min()), int(positions.max())  # one host sync
    if lo < 0 or hi >= Tc:
        raise InputError(f"positions must be in [0, {Tc - 1}], got min {lo}, max {hi}")


def check_generate_args(
    model: object,
    prompt_ids: object,
    attention_mask: object,
    max_new_tokens: object,
    knobs: tuple[float, int | None, float | None],
    eos_id: object,
    generator: object,
    trace_layer: object,
) -> None:
    """Every check ``generate`` runs before any forward; ``knobs`` is ``(temperature,
    top_k, top_p)``. ``t + max_new_tokens <= cfg.T`` with ``t`` the padded width.
    """
    gpt = check_model(model)
    ids = check_tokens(gpt, prompt_ids, "prompt_ids")
    check_mask(attention_mask, ids, "prompt_ids", need_real=True)
    if (
        isinstance(max_new_tokens, bool)
        or not isinstance(max_new_tokens, int)
        or max_new_tokens < 0
    ):
        raise InputError(
            f"max_new_tokens must be an int >= 0, got {type(max_new_tokens).__name__} "
            f"{max_new_tokens!r}"
        )
    B, t = ids.shape
    T = gpt.cfg.T
    if t + max_new_tokens > T:
        raise InputError(
            f"padded prompt length t + max_new_tokens must be <= cfg.T = {T}, got "
            f"{t} + {max_new_tokens} = {t + max_new_tokens}"
        )
    check_knobs(*knobs)  # kv_cache.generate's own check
    V = gpt.cfg.V
    if eos_id is not None and not is_index(eos_id, 0, V):
        raise InputError(f"eos_id must be None or a token id in [0, {V - 1}], got {eos_id!r}")
    check_generator(generator, B, gpt.tok_emb.weight.device)  # kv_cache.generate's own check
    check_trace_layer(trace_layer, len(gpt.blocks))


def check_loss_args(logits: object, targets: object, attention_mask: object) -> None:
    """``padded_cross_entropy``'s inputs: logits ``(B, t, V)`` floating with ``t, V >= 1``,
    targets ``(B, t)`` int64 on their device, the mask as ``check_mask`` (all-padding
    rows allowed) and, with a mask, counted targets in ``[0, V)``. Without a mask the
    values are ``F.cross_entropy``'s to judge.
    """
    if not isinstance(logits, torch.Tensor):
        raise InputError(f"logits must be a torch.Tensor, got {type(logits).__name__}")
    if logits.ndim != 3 or not logits.dtype.is_floating_point or 0 in logits.shape[1:]:
        raise InputError(
            f"logits must be a 3-D (B, t, V) floating tensor with t, V >= 1, got shape "
            f"{tuple(logits.shape)} dtype {logits.dtype}"
        )
    if not isinstance(targets, torch.Tensor):
        raise InputError(f"targets must be a torch.Tensor, got {type(targets).__name__}")
    if targets.shape != logits.shape[:2] or targets.dtype != torch.int64:
        raise InputError(
            f"targets must be (B, t) = {tuple(logits.shape[:2])} int64, got shape "
            f"{tuple(targets.shape)} dtype {targets.dtype}"
        )
    if targets.device != logits.device:
        raise InputError(
            f"targets device must be the logits' ({logits.device}), got {targets.device}"
        )
    mask = check_mask(attention_mask, targets, "targets")
    if mask is None or targets.numel() == 0:
        return
    counted = targets.masked_fill(~mask, 0)  # (B, t), pads read as a valid 0
    V = logits.shape[-1]
    lo, hi = int(counted.min()), int(counted.max())  # one host sync
    if lo < 0 or hi >= V:
        raise InputError(
            f"targets at counted positions must be in [0, {V - 1}], got min {lo}, max {hi}"
        )
