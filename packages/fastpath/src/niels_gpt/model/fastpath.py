"""Fast path: SDPA attention that is a drop-in for the explicit stage-000 module.

Shape notation::

    B: batch, T: sequence length (<= cfg.T), C: width, H: heads, D = C // H

``FastCausalSelfAttention`` computes what ``CausalSelfAttention`` computes, with
``torch.nn.functional.scaled_dot_product_attention`` (``is_causal=True``, the
same ``1/sqrt(D)`` scale, dropout of ``attn_dropout.p`` on the probabilities in
training mode) doing the core whenever the probabilities are not asked for.
A call with ``return_attn=True`` runs the explicit parent, so traces are exactly
the explicit path's. The subclass adds no parameters and no buffers, which is
what makes an in-place switch possible: ``use_fast_attention`` changes the class
of each explicit attention module inside a model, and nothing else.

Under ``torch.autocast`` or in a half-precision module the fast path makes the
explicit path's precision choice for RoPE (float32 rotation, back to the
activation dtype; see ``niels_gpt.model.attention``), then SDPA runs on q, k and
v in the activation dtype with its own internal softmax precision.
"""

from __future__ import annotations

import math
from typing import Literal, overload

import torch
import torch.nn.functional as F
from torch import nn

import niels_gpt.model.rope as rope
from niels_gpt.checks import check_features, check_length, check_like
from niels_gpt.model.attention import CausalSelfAttention

__all__ = ["FastCausalSelfAttention", "use_explicit_attention", "use_fast_attention"]


class FastCausalSelfAttention(CausalSelfAttention):
    """``CausalSelfAttention`` with an SDPA core for calls that need no probabilities.

    Same constructor, parameters (``qkv``, ``proj``), non-persistent buffers
    (``rope_sin``, ``rope_cos``, ``mask``), dropouts and ``state_dict`` as the
    parent; build it directly or switch a built model with ``use_fast_attention``.
    """

    # Typed views of the one forward below: the flag decides the return type.
    @overload
    def forward(self, x: torch.Tensor, *, return_attn: Literal[False] = False) -> torch.Tensor: ...
    @overload
    def forward(
        self, x: torch.Tensor, *, return_attn: Literal[True]
    ) -> tuple[torch.Tensor, torch.Tensor]: ...
    @overload
    def forward(
        self, x: torch.Tensor, *, return_attn: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]: ...

    def forward(
        self,
        x: torch.Tensor,
        *,
        return_attn: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend causally over ``x`` of shape ``(B, T, C)``.

        With ``return_attn=True`` this is the explicit parent's forward, which
        returns ``(y, attn)`` with the ``(B, H, T, T)`` pre-dropout softmax.
        Otherwise it returns ``y`` of shape ``(B, T, C)`` computed by SDPA, with
        the parent's input checks and RoPE.
        """
        if return_attn:
            return super().forward(x, return_attn=True)
        check_features(x, "x", ndim=3, last=self.cfg.C)
        check_like(x, "x", self.qkv.weight, "attention")
        B, T, C = x.shape
        check_length(T, self.cfg.T)
        H, D = self.n_head, self.head_dim

        q, k, v = self.qkv(x).split(C, dim=-1)  # (B, T, C) each
        q = q.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        k = k.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        v = v.view(B, T, H, D).transpose(1, 2)  # (B, H, T, D)
        # RoPE in float32 and back, as the explicit path does (see its module docstring)
        q_rot, k_rot = rope.apply_rope(*self._rope_operands(q, k))  # (B, H, T, D), float32+
        q, k = q_rot.to(v.dtype), k_rot.to(v.dtype)  # (B, H, T, D) in the activation dtype
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            dropout_p=self.attn_dropout.p if self.training else 0.0,
            is_causal=True,
            scale=1.0 / math.sqrt(D),
        )  # (B, H, T, D)
        out = out.transpose(1, 2).reshape(B, T, C)  # (B, T, C)
        y: torch.Tensor = self.resid_dropout(self.proj(out))  # (B, T, C)
        return y


def _switch(model: nn.Module, target: type[CausalSelfAttention]) -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(f"expected an nn.Module, got {type(model).__name__}")
    known = (CausalSelfAttention, FastCausalSelfAttention)
    for name, module in model.named_modules():
        if isinstance(module, CausalSelfAttention) and type(module) not in known:
            raise TypeError(
                f"{name or 'model'} is a {type(module).__name__}, a subclass this switch "
                "does not know; refusing to replace its forward"
            )
    for module in model.modules():
        if type(module) in known:
            # Same object, same parameters, buffers, hooks and training flag:
            # only the class, hence forward, changes. Neither class has state
            # the other lacks.
            module.__class__ = target
    return model


def use_fast_attention(model: nn.Module) -> nn.Module:
    """Switch every ``CausalSelfAttention`` inside ``model`` to the fast path, in place.

    Works on a ``GPT``, a ``Block``, an attention module or any tree holding
    them. Parameters, buffers and ``state_dict`` are untouched, so an optimizer
    built before the switch keeps working. Switch before ``torch.compile``.

    Returns:
        ``model`` itself.

    Raises:
        TypeError: ``model`` is not a module, or it holds a subclass of
            ``CausalSelfAttention`` other than the two this package knows.
    """
    return _switch(model, FastCausalSelfAttention)


def use_explicit_attention(model: nn.Module) -> nn.Module:
    """Undo ``use_fast_attention``: every attention module runs the explicit path again.

    Returns:
        ``model`` itself.
    """
    return _switch(model, CausalSelfAttention)
