"""Fast path: SDPA as the kernel of the one attention, for calls that need no probabilities.

Shape notation::

    B: batch, T: queries in a call (<= cfg.T), S >= T: keys it sees (p cached
    ones, then its own T), H: heads, D = C // H

The attention stage chooses a module's kernel in one place: ``module.kernel``
(``None``: its explicit core) serves a call with no probabilities and no key
mask, through a KV cache or not; every other call runs the explicit core. This
stage provides ``sdpa_kernel``, the one place the fused
``torch.nn.functional.scaled_dot_product_attention`` is called (causal from the
bottom right, the same ``1/sqrt(D)`` scale, the module's attention dropout
rate in training), and sets it as the kernel of attention modules. Nothing else changes: the same
module objects, classes, parameters, buffers and ``state_dict``; RoPE, the
projections, the residual dropout and every precision choice are the
attention stage's code, so traces are exactly the explicit path's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention, attention_modules

__all__ = ["FastCausalSelfAttention", "sdpa_kernel", "use_explicit_attention", "use_fast_attention"]


def sdpa_kernel(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout_p: float, scale: float
) -> torch.Tensor:
    """Causal attention of rotated q ``(B, H, T, D)`` and k, v ``(B, H_kv, S, D)`` through SDPA.

    ``H_kv`` divides ``H``; with ``H_kv < H`` SDPA runs with ``enable_gqa``:
    query head ``h`` reads key/value head ``h // (H // H_kv)``, nothing copied.

    The attention stage's ``AttentionKernel``: with ``S >= T`` keys (``S - T``
    of them cached), query ``i`` sees keys ``0 .. S - T + i``; scores are
    scaled by ``scale`` and ``dropout_p`` drops probabilities. Returns
    ``(B, H, T, D)``. ``S == T`` is SDPA's own causal mask, ``T == 1`` needs
    none (the one query sees every key), anything else gets the bottom-right
    aligned lower-triangular ``(T, S)`` mask.

    Raises:
        ValueError: fewer keys than queries (``S < T``).
    """
    T, S = q.shape[-2], k.shape[-2]
    gqa = k.shape[1] != q.shape[1]  # H_kv < H: SDPA reads each K/V head for its G queries
    if S == T:
        return F.scaled_dot_product_attention(
            q, k, v, dropout_p=dropout_p, is_causal=True, scale=scale, enable_gqa=gqa
        )  # (B, H, T, D)
    if S < T:
        raise ValueError(f"sdpa_kernel needs at least as many keys as queries ({T}), got {S}")
    visible = None if T == 1 else torch.ones(T, S, dtype=torch.bool, device=q.device).tril(S - T)
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=visible, dropout_p=dropout_p, scale=scale, enable_gqa=gqa
    )  # (B, H, T, D); visible: None or (T, S), True = seen


class FastCausalSelfAttention(CausalSelfAttention):
    """``CausalSelfAttention`` built with ``sdpa_kernel`` as its kernel.

    Same constructor, forward, parameters (``qkv``, ``proj``), non-persistent
    buffers, dropouts and ``state_dict`` as the parent: only ``kernel`` differs.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.kernel = sdpa_kernel


def _attention_modules(model: nn.Module) -> list[CausalSelfAttention]:
    """Every attention module inside ``model`` (the attention stage's walk);
    ``TypeError`` for a non-module or for a subclass this stage does not know
    (its math may not be the one attention's)."""
    if not isinstance(model, nn.Module):  # this stage's documented TypeError, exactly
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    known = (CausalSelfAttention, FastCausalSelfAttention)
    found = attention_modules(model)
    for name, module in found:
        if type(module) not in known:
            raise TypeError(
                f"{name or 'model'} is a {type(module).__name__}, a subclass this stage "
                "does not know; refusing to set its kernel"
            )
    return [module for _, module in found]


def use_fast_attention(model: nn.Module) -> nn.Module:
    """Give every attention module inside ``model`` the SDPA kernel, in place.

    Works on a ``GPT``, a ``Block``, an attention module or any tree holding
    them. Only each module's ``kernel`` changes: parameters, buffers, classes
    and ``state_dict`` are untouched, so an optimizer built before keeps
    working. Set it before ``torch.compile``.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not a module, or it holds a subclass of
            ``CausalSelfAttention`` other than the two this package knows
            (nothing is changed then).
    """
    for module in _attention_modules(model):
        module.kernel = sdpa_kernel
    return model


def use_explicit_attention(model: nn.Module) -> nn.Module:
    """Undo ``use_fast_attention``: every attention module's kernel is ``None`` again.

    Returns:
        ``model`` itself.
    """
    for module in _attention_modules(model):
        module.kernel = None
    return model
