"""Float64 reference of the padding stage's public API (maintainer-owned).

The oracle's reference worker loads this one file in place of each of the
stage's three modules (``niels_gpt.model.padding`` and its private
``padding._frame`` and ``padding._checks``, which nothing outside the stage
imports) for the calls ``reference_calls`` of ``specs/padding.toml`` names. It is
written from that spec's API comments and seed 002, not from the stage's code,
and it computes what the spec says a padded call equals rather than how the
stage gets there (hooks, a key mask, per-row positions, a padded cache):

- ``padded_forward`` on a batch with a pad: row ``b``'s real columns hold the
  row alone's logits (and trace), the padded ones exactly 0. Each row alone is
  run uncached through the model with every floating parameter and buffer
  replaced by its float64 value (``torch.func.functional_call``, so gradients
  reach the caller's parameters), and the result is rounded to the model's
  dtype (the trace's probabilities to float32, float64 in a float64 model).
  Without a pad it is the model's own forward, as the spec says.
- ``padded_cross_entropy`` with a mask: the mean over the real inputs'
  positions of the per-token cross entropy, in float64, rounded to the logits'
  dtype; without one ``F.cross_entropy`` itself.
- ``generate`` with a pad: each step's logits for row ``b``
  come from an uncached forward of that row's real tokens so far on a float64
  copy of the model, rounded to the model's dtype and promoted as kv_cache's
  2.3 says; tokens are chosen as kv_cache chooses them (argmax, or
  ``torch.multinomial`` on the softmax of ``kv_cache.filter_logits``: one call
  over all rows, or one a row with a generator list). Traces put the row
  alone's last-query probabilities at its real columns, 0 at its pads.
  Otherwise it is ``kv_cache.generate`` itself.
- ``apply_rope_rows``: the pair rotation ``(2i, 2i+1)`` of the rope spec in
  float64 at each row's own table rows, rounded to q's dtype.

Every argument error is ``InputError``, raised before any work, as the spec lists.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any, TypeGuard

import torch
import torch.nn.functional as F
from torch import nn

import niels_gpt.model.kv_cache as kv_cache
from niels_gpt.checks import InputError
from niels_gpt.model.attention import CausalSelfAttention
from niels_gpt.model.gpt import GPT, AttnTrace

__all__ = ["apply_rope_rows", "generate", "padded_cross_entropy", "padded_forward"]


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


# --- checks ---------------------------------------------------------------------


def _check_model(model: object) -> GPT:
    if not isinstance(model, GPT):
        raise InputError(f"model must be a GPT, got {type(model).__name__}")
    for m in model.modules():
        if isinstance(m, CausalSelfAttention):
            if type(m).forward is not CausalSelfAttention.forward:
                raise InputError(f"{type(m).__name__} has a forward of its own")
            if getattr(m, "kv_cache", None) is not None:
                raise InputError("a KV cache is set up on the model: drop_kv_cache first")
    return model


def _check_ids(model: GPT, ids: object, name: str) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype != torch.int64:
        raise InputError(f"{name} must be a 2-D int64 tensor, got {ids!r:.60}")
    device = model.tok_emb.weight.device
    if ids.device != device:
        raise InputError(f"{name} must be on {device}, got {ids.device}")
    if ids.shape[0] < 1 or not 1 <= ids.shape[1] <= model.cfg.T:
        raise InputError(
            f"{name} must be (B >= 1, 1 <= t <= {model.cfg.T}), got {tuple(ids.shape)}"
        )
    if int(ids.min()) < 0 or int(ids.max()) >= model.cfg.V:
        raise InputError(f"{name} must be in [0, {model.cfg.V})")
    return ids


def _check_mask(mask: object, like: torch.Tensor, *, every_row_real: bool) -> torch.Tensor | None:
    """None, or a left-padded bool (B, t) mask on ``like``'s device; returns it."""
    if mask is None:
        return None
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool:
        raise InputError(f"attention_mask must be torch.bool, got {getattr(mask, 'dtype', mask)}")
    if mask.shape != like.shape or mask.device != like.device:
        raise InputError(f"attention_mask must be {tuple(like.shape)}, got {tuple(mask.shape)}")
    bad = (mask[:, :-1] & ~mask[:, 1:]).any(-1)  # (B,): a False after a True
    if every_row_real:
        bad |= ~mask.any(-1)
    if bool(bad.any()):
        raise InputError(
            f"attention_mask row {int(bad.int().argmax())} is not left-padded real tokens"
        )
    return mask


def _check_layer(trace_layer: object, model: GPT) -> None:
    if trace_layer is not None and (not _is_int(trace_layer) or not 0 <= trace_layer < model.cfg.L):
        raise InputError(
            f"trace_layer must be None or an int in [0, {model.cfg.L}), got {trace_layer!r}"
        )


# --- rope rows -------------------------------------------------------------------


def apply_rope_rows(
    q: torch.Tensor, k: torch.Tensor, sin: torch.Tensor, cos: torch.Tensor, positions: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """q, k ``(B, H, n, D)`` rotated at ``positions`` ``(B, n)`` of ``(1, 1, Tc, D/2)`` tables."""
    for name, value in (("q", q), ("k", k), ("sin", sin), ("cos", cos), ("positions", positions)):
        if not isinstance(value, torch.Tensor):
            raise InputError(f"{name} must be a tensor, got {type(value).__name__}")
    if q.dim() != 4 or q.shape[0] < 1 or q.shape[2] < 1 or not q.is_floating_point():
        raise InputError(
            f"q must be a floating (B, H, n, D) tensor, got {tuple(q.shape)} {q.dtype}"
        )
    if (k.shape, k.dtype, k.device) != (q.shape, q.dtype, q.device):
        raise InputError(f"k must be like q {tuple(q.shape)}, got {tuple(k.shape)} {k.dtype}")
    b, _, n, d = q.shape
    if d % 2:
        raise InputError(f"D must be even, got {d}")
    for name, table in (("sin", sin), ("cos", cos)):
        if (
            table.dim() != 4
            or table.shape[:2] != (1, 1)
            or table.shape[2] < 1
            or table.shape[3] != d // 2
        ):
            raise InputError(f"{name} must be (1, 1, Tc, {d // 2}), got {tuple(table.shape)}")
        if table.dtype != q.dtype or table.device != q.device:
            raise InputError(f"{name} must be {q.dtype} on {q.device}")
    if sin.shape != cos.shape:
        raise InputError(f"sin and cos must match, got {tuple(sin.shape)} and {tuple(cos.shape)}")
    if positions.shape != (b, n) or positions.dtype != torch.int64 or positions.device != q.device:
        raise InputError(f"positions must be ({b}, {n}) int64, got {tuple(positions.shape)}")
    if int(positions.min()) < 0 or int(positions.max()) >= sin.shape[2]:
        raise InputError(f"positions must be in [0, {sin.shape[2]})")
    s = sin[0, 0].double()[positions][:, None]  # (B, 1, n, D/2)
    c = cos[0, 0].double()[positions][:, None]  # (B, 1, n, D/2)

    def turn(x: torch.Tensor) -> torch.Tensor:
        a, z = x.double()[..., 0::2], x.double()[..., 1::2]  # (B, H, n, D/2) each
        return torch.stack((a * c - z * s, a * s + z * c), dim=-1).flatten(-2).to(q.dtype)

    return turn(q), turn(k)  # (B, H, n, D) each


# --- the padded forward ------------------------------------------------------------


class _Traced(nn.Module):
    """``gpt.forward_with_attn_trace`` as a module's forward, for functional_call."""

    def __init__(self, gpt: GPT) -> None:
        super().__init__()
        self.gpt = gpt

    def forward(self, x: torch.Tensor, layer: int | None) -> Any:
        if layer is None:
            return self.gpt(x), None
        return self.gpt.forward_with_attn_trace(x, layer, return_full_attn=True)


def _exact(model: GPT, x: torch.Tensor, layer: int | None) -> tuple[torch.Tensor, Any]:
    """``model`` on ``x`` ``(1, n)`` with float64 parameters and buffers; grads reach ``model``."""
    wrapper = _Traced(model)
    state = {
        name: value.double() if value.is_floating_point() else value
        for name, value in [*wrapper.named_parameters(), *wrapper.named_buffers()]
    }
    out: tuple[torch.Tensor, Any] = torch.func.functional_call(wrapper, state, (x, layer))
    return out


def padded_forward(
    model: GPT,
    ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    *,
    trace_layer: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, AttnTrace]:
    """Logits ``(B, t, V)`` (and a trace) of a left-padded batch: each row alone, 0 at pads."""
    gpt = _check_model(model)
    _check_ids(gpt, ids, "ids")
    mask = _check_mask(attention_mask, ids, every_row_real=False)
    _check_layer(trace_layer, gpt)
    if mask is None or bool(mask.all()):
        if trace_layer is None:
            plain: torch.Tensor = gpt(ids)  # (B, t, V)
            return plain
        return gpt.forward_with_attn_trace(ids, trace_layer, return_full_attn=True)
    t = ids.shape[1]
    dtype = gpt.tok_emb.weight.dtype
    if torch.is_autocast_enabled("cpu"):
        dtype = torch.get_autocast_dtype("cpu")
    probs_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    pads = (~mask).sum(-1).tolist()  # B ints
    rows, fulls = [], []
    with torch.autocast("cpu", enabled=False):
        for row, p in enumerate(pads):
            logits = ids.new_zeros(t, gpt.cfg.V, dtype=dtype)  # (t, V)
            full = ids.new_zeros(gpt.cfg.H, t, t, dtype=probs_dtype)  # (H, t, t)
            if p < t:
                alone, trace = _exact(gpt, ids[row : row + 1, p:], trace_layer)
                logits = torch.cat((logits[:p], alone[0].to(dtype)))  # (t, V)
                if trace is not None:
                    full[:, p:, p:] = trace["attn_full"][0].to(probs_dtype)  # (H, t-p, t-p)
            rows.append(logits)
            fulls.append(full)
    out = torch.stack(rows)  # (B, t, V)
    if trace_layer is None:
        return out
    attn_full = torch.stack(fulls).detach()  # (B, H, t, t)
    trace_out: AttnTrace = {
        "layer": trace_layer,
        "attn_row": attn_full[:, :, -1, :],
        "attn_full": attn_full,
    }
    return out, trace_out


def padded_cross_entropy(
    logits: torch.Tensor, targets: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """Mean next-token loss over the real inputs' positions (0-d, the logits' dtype)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 3 or not logits.is_floating_point():
        raise InputError(f"logits must be a 3-D floating tensor, got {logits!r:.60}")
    b, t, v = logits.shape
    if t < 1 or v < 1:
        raise InputError(f"logits must have t >= 1 and V >= 1, got {tuple(logits.shape)}")
    if not isinstance(targets, torch.Tensor) or targets.shape != (b, t):
        raise InputError(f"targets must be ({b}, {t}), got {getattr(targets, 'shape', targets)}")
    if targets.dtype != torch.int64 or targets.device != logits.device:
        raise InputError(f"targets must be int64 on {logits.device}, got {targets.dtype}")
    mask = _check_mask(attention_mask, targets, every_row_real=False)
    if mask is None:
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
    counted = targets[mask]  # (N,)
    if counted.numel() and (int(counted.min()) < 0 or int(counted.max()) >= v):
        raise InputError(f"a counted target is outside [0, {v})")
    picked = logits.double()[mask]  # (N, V) float64
    losses = torch.logsumexp(picked, -1) - picked.gather(-1, counted[:, None])[:, 0]  # (N,)
    return (losses.sum() / max(counted.numel(), 1)).to(logits.dtype)


# --- padded generation -------------------------------------------------------------


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
    """kv_cache.generate for a left-padded prompt batch: each row as if alone."""
    gpt = _check_model(model)
    prompt = _check_ids(gpt, prompt_ids, "prompt_ids")
    b, t = prompt.shape
    if not _is_int(max_new_tokens) or max_new_tokens < 0:
        raise InputError(f"max_new_tokens must be an int >= 0, got {max_new_tokens!r}")
    if t + max_new_tokens > gpt.cfg.T:
        raise InputError(f"t + max_new_tokens must be <= {gpt.cfg.T}, got {t + max_new_tokens}")
    kv_cache.check_knobs(temperature, top_k, top_p)
    if eos_id is not None and (not _is_int(eos_id) or not 0 <= eos_id < gpt.cfg.V):
        raise InputError(f"eos_id must be None or an int in [0, {gpt.cfg.V}), got {eos_id!r}")
    kv_cache.check_generator(generator, b, gpt.tok_emb.weight.device)
    _check_layer(trace_layer, gpt)
    mask = _check_mask(attention_mask, prompt, every_row_real=True)
    knobs = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    if mask is None or bool(mask.all()):  # kv_cache.generate, whose generator lists draw as here
        return kv_cache.generate(
            gpt, prompt, max_new_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
            eos_id=eos_id, generator=generator, trace_layer=trace_layer,
        )  # fmt: skip
    pads = [0] * b if mask is None else (~mask).sum(-1).tolist()
    ids = torch.empty(b, t + max_new_tokens, dtype=torch.int64, device=prompt.device)
    ids[:, :t] = prompt
    traces: list[torch.Tensor] = []
    if max_new_tokens > 0:
        traces = _decode(gpt, ids, t, pads, knobs, eos_id, generator, trace_layer)
    return ids if trace_layer is None else (ids, traces)


def _decode(
    gpt: GPT,
    ids: torch.Tensor,
    t: int,
    pads: list[int],
    knobs: dict[str, Any],
    eos_id: int | None,
    generator: Any,
    trace_layer: int | None,
) -> list[torch.Tensor]:
    """Fill ``ids[:, t:]`` step by step from uncached float64 row-alone forwards."""
    b = ids.shape[0]
    dtype = gpt.tok_emb.weight.dtype
    sample_dtype = torch.promote_types(dtype, torch.float32)
    trace_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    twin = copy.deepcopy(gpt).double()
    traces: list[torch.Tensor] = []
    finished = torch.zeros(b, dtype=torch.bool, device=ids.device)  # (B,)
    with torch.no_grad():
        for col in range(t, ids.shape[1]):
            last, rows = [], []
            for row, p in enumerate(pads):
                alone = ids[row : row + 1, p:col]  # (1, col - p)
                if trace_layer is None:
                    out = twin(alone)  # (1, col - p, V)
                else:
                    out, trace = twin.forward_with_attn_trace(alone, trace_layer)
                    attn = trace["attn_row"][0].to(trace_dtype)  # (H, col - p)
                    rows.append(torch.cat((attn.new_zeros(attn.shape[0], p), attn), -1))
                last.append(out[0, -1])  # (V,) float64
            if trace_layer is not None:
                traces.append(torch.stack(rows))  # (B, H, col)
            logits = torch.stack(last).to(dtype).to(sample_dtype)  # (B, V)
            token = _choose(logits, knobs, generator)  # (B,)
            if eos_id is not None:
                token = torch.where(finished, torch.full_like(token, eos_id), token)
                finished |= token == eos_id
            ids[:, col] = token
            if eos_id is not None and bool(finished.all()):
                ids[:, col + 1 :] = eos_id
                break
    return traces


def _choose(logits: torch.Tensor, knobs: dict[str, Any], generator: Any) -> torch.Tensor:
    """kv_cache's token choice on ``(B, V)`` logits: ``(B,)`` int64."""
    if knobs["temperature"] == 0:
        return logits.argmax(dim=-1)  # (B,)
    probs = torch.softmax(kv_cache.filter_logits(logits, **knobs), dim=-1)  # (B, V)
    if isinstance(generator, list | tuple):
        return torch.cat(
            [
                torch.multinomial(probs[r : r + 1], 1, generator=g)[0]
                for r, g in enumerate(generator)
            ]
        )
    one = generator if isinstance(generator, torch.Generator) else None
    return torch.multinomial(probs, num_samples=1, generator=one)[:, 0]  # (B,)
