"""Left-padded batches: a padded forward, padded generation and a padded loss.

Shape notation::

    B: batch, t: padded length, P_b: leading pads of row b, t_b = t - P_b its
    real tokens, H: heads, D = C // H, T = cfg.T, V: vocabulary, L: layers

The attention mask is ``(B, t)`` bool, True = real token, and left-padded:
each row is its pads, then its real tokens, so every row's last token sits in
the last column. A row's positions start at 0 at its first real token, so a
row's logits do not depend on how much padding it got: they are the logits of
the row alone, and every padded position's logits are exactly 0.

The attention stage's one attention takes per-row positions and a key mask
and reads a KV cache; ``_frame`` hands it the batch's frame through
forward pre-hooks for the length of a call, so ``GPT`` and ``Block`` run
unchanged and no module changes class. ``generate`` is ``kv_cache.generate``
run inside that frame: its caches (``t + max_new_tokens`` positions) hold the
padded frame, and its sampling, per-row generators and eos are the kv_cache
stage's. With no mask, or a mask without a pad, every function is the
unpadded code itself.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

import niels_gpt.model.attention as attention
import niels_gpt.model.kv_cache as kv_cache
from niels_gpt.model.gpt import GPT, AttnTrace
from niels_gpt.model.padding._checks import (
    check_generate_args,
    check_loss_args,
    check_mask,
    check_model,
    check_rope_rows,
    check_tokens,
    check_trace_layer,
)
from niels_gpt.model.padding._frame import RowFrame, framed

__all__ = ["apply_rope_rows", "generate", "padded_cross_entropy", "padded_forward"]

Knobs = tuple[float, int | None, float | None]


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
        cos[:, :, positions[b]])``: the attention stage's ``rotate_rows``.

    Raises:
        InputError: any input out of its contract (one host sync reads the
            positions' range), before rope is called; nothing is cast.
    """
    check_rope_rows(q, k, sin, cos, positions)
    return attention.rotate_rows(q, k, sin, cos, positions)


def _pads(mask: torch.Tensor) -> torch.Tensor:
    """The ``(B,)`` int64 count of leading pads of each row of a left-padded mask."""
    return mask.shape[1] - mask.sum(dim=-1)  # (B,)


def padded_forward(
    model: GPT,
    ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    trace_layer: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, AttnTrace]:
    """A GPT v1's logits (and trace) on a left-padded batch.

    Args:
        model: a ``GPT`` whose attention is the attention stage's (any kernel),
            with no KV cache set up.
        ids: ``(B, t)`` int64 ids in ``[0, V)`` (pads too, any value) on the
            model's device, ``1 <= t <= cfg.T``.
        attention_mask: ``(B, t)`` bool, True = real, left-padded, at least
            one True a row; ``None`` means every token is real.
        trace_layer: also return the ``AttnTrace`` of that layer, with
            ``attn_full`` ``(B, H, t, t)`` always given.

    Returns:
        logits ``(B, t, V)``: row ``b``'s columns ``[P_b, t)`` are the logits of
        ``ids[b:b+1, P_b:]`` alone, padded columns exactly 0; or ``(logits,
        trace)``. Without a pad this is ``model(ids)`` (or
        ``model.forward_with_attn_trace(ids, trace_layer, True)``) itself.
        The model is handed back as it was found, on return or on an error.

    Raises:
        InputError: a bad model, ids, mask or trace_layer, before any work.
    """
    gpt = check_model(model)
    x = check_tokens(gpt, ids, "ids")
    mask = check_mask(attention_mask, x, "ids")
    check_trace_layer(trace_layer, len(gpt.blocks))
    if mask is None or bool(mask.all()):
        if trace_layer is None:
            logits: torch.Tensor = gpt(x)  # (B, t, V)
            return logits
        return gpt.forward_with_attn_trace(x, trace_layer, return_full_attn=True)
    with framed(gpt, RowFrame(_pads(mask))):
        if trace_layer is None:
            out = gpt(x)  # (B, t, V)
        else:
            out, trace = gpt.forward_with_attn_trace(x, trace_layer, return_full_attn=True)
    logits = out.masked_fill(~mask[:, :, None], 0.0)  # (B, t, V), padded columns exactly 0
    if trace_layer is None:
        return logits
    return logits, trace


def padded_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """The next-token loss of a left-padded batch: a token mean over real inputs.

    Args:
        logits: ``(B, t, V)`` floating, e.g. ``padded_forward``'s.
        targets: ``(B, t)`` int64 on the logits' device; ``targets[b, j]``
            follows ``ids[b, j]``. Ignored (any value) where the input is a pad.
        attention_mask: the inputs' ``(B, t)`` mask (all-padding rows allowed),
            or ``None``: then this is ``F.cross_entropy`` itself.

    Returns:
        A 0-d tensor in the logits' dtype: the per-token cross-entropies summed
        over the positions whose input is real, divided by ``max(N, 1)`` for
        ``N`` such positions (0 when nothing counts). Padded positions get
        exactly zero gradient.

    Raises:
        InputError: bad shapes, dtypes or devices, a bad mask, or a counted
            target outside ``[0, V)``.
    """
    check_loss_args(logits, targets, attention_mask)
    flat = logits.flatten(0, 1)  # (B*t, V)
    if attention_mask is None:
        return F.cross_entropy(flat, targets.flatten())
    ignored = -100  # F.cross_entropy's ignore_index: zero loss, zero gradient
    kept = targets.masked_fill(~attention_mask, ignored).flatten()  # (B*t,)
    losses = F.cross_entropy(flat, kept, ignore_index=ignored, reduction="none")  # (B*t,)
    counted = attention_mask.sum().clamp(min=1)  # 0-d int64, max(N, 1)
    return losses.sum() / counted  # 0-d


def generate(
    model: GPT,
    prompt_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    max_new_tokens: int,
    *,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    eos_id: int | None = None,
    generator: torch.Generator | Sequence[torch.Generator] | None = None,
    trace_layer: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
    """``kv_cache.generate`` for a left-padded prompt batch.

    Row ``b`` gets the tokens (and traces, zero at its padded columns) of
    generating its real prompt ``prompt_ids[b:b+1, P_b:]`` alone. It is
    ``kv_cache.generate`` with the batch's frame on the attention modules: the
    prompt runs once (the prefill), then one token a step, through kv_cache's
    ``(B, H, t + max_new_tokens, D)`` caches, which hold the padded frame
    (cache index = column); the token at column ``c >= t`` is rotated at
    position ``c - P_b``. The model is handed back as it was found.

    Args:
        model, prompt_ids, max_new_tokens, temperature, top_k, top_p, eos_id,
            trace_layer: as in ``kv_cache.generate``, with ``t`` the padded
            width (``t + max_new_tokens <= cfg.T``).
        attention_mask: the prompt's ``(B, t)`` left-padding mask, or ``None``.
        generator: ``None`` or one ``torch.Generator`` (one draw a step over all
            rows, as ``kv_cache.generate``), or a list or tuple of ``B`` of them:
            row ``b`` draws from ``generator[b]`` alone, as its alone run would.

    Returns:
        ``ids`` ``(B, t + max_new_tokens)`` int64 beginning with ``prompt_ids``
        (pads included), or ``(ids, traces)`` with ``traces[i]`` ``(B, H, t + i)``.
        Without a pad: ``kv_cache.generate`` itself.

    Raises:
        InputError: any argument out of range, before any forward or hook.
    """
    knobs: Knobs = (temperature, top_k, top_p)
    check_generate_args(
        model, prompt_ids, attention_mask, max_new_tokens, knobs, eos_id, generator, trace_layer
    )

    def run() -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        return kv_cache.generate(
            model,
            prompt_ids,
            max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            eos_id=eos_id,
            generator=generator,
            trace_layer=trace_layer,
        )

    if attention_mask is None or bool(attention_mask.all()):
        return run()
    # kv_cache.generate sets up the caches: t + max_new_tokens positions, cache index = column
    with framed(model, RowFrame(_pads(attention_mask))):
        return run()
