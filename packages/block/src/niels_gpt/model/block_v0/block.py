"""Transformer block v0: pre-norm LayerNorm wiring, GELU MLP, GPT-style init.

Shape notation::

    B: batch, T: sequence length, C: width, F: MLP hidden width (cfg.d_ff)
"""

from __future__ import annotations

from typing import Literal, overload

import torch
from torch import nn

from niels_gpt.checks import check_features, check_like
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

__all__ = ["MLP", "Block", "check_input", "init_weights"]


def check_input(x: torch.Tensor, weight: torch.Tensor, owner: str) -> None:
    """Require ``x`` of shape ``(B, T, C)`` in ``weight``'s dtype and on its device.

    ``C`` is ``weight.shape[-1]``: a norm's ``(C,)`` weight, or the ``(out, C)``
    weight of the Linear that reads ``x``. ``owner`` names the module in the
    message. Nothing is cast: a float64 input to a float32 module is refused.

    Raises:
        InputError: ``x`` is not 3-D, its last dim is not ``C``, or its dtype or
            device differ from ``weight``'s; the message names both.
    """
    check_features(x, "x", ndim=3, last=weight.shape[-1])
    check_like(x, "x", weight, owner)


class MLP(nn.Module):
    """``Linear(C, d_ff) -> GELU -> Linear(d_ff, C)``, both with bias.

    Input and output are ``(B, T, C)``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.C, cfg.d_ff, bias=True)
        self.act = nn.GELU()
        self.proj = nn.Linear(cfg.d_ff, cfg.C, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, T, C)`` to ``(B, T, C)``.

        Raises:
            InputError: from ``check_input`` against ``fc``'s ``(F, C)`` weight.
        """
        check_input(x, self.fc.weight, "MLP")
        h = self.act(self.fc(x))  # (B, T, F)
        out: torch.Tensor = self.proj(h)  # (B, T, C)
        return out


class Block(nn.Module):
    """Pre-norm residual block with one dropout shared by both branches::

    x = x + dropout(attn(ln1(x)))
    x = x + dropout(mlp(ln2(x)))

    The constructor builds ``ln1``, ``attn``, ``ln2``, ``mlp`` and ``dropout``
    in that order, the norms through ``make_norm`` and the MLP through
    ``make_mlp``. A subclass that overrides only those two (v1: RMSNorm and
    SwiGLU) keeps this wiring, its input checks and its order of seeded draws.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = self.make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = self.make_norm(cfg)
        self.mlp = self.make_mlp(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def make_norm(self, cfg: ModelConfig) -> nn.Module:
        """One of the two norms, ``(B, T, C) -> (B, T, C)``: ``LayerNorm(C, eps=1e-5)``.

        An override must return a module with a ``(C,)`` ``weight`` (the input
        checks read it) and draw its weights as it is built.
        """
        return nn.LayerNorm(cfg.C, eps=1e-5)

    def make_mlp(self, cfg: ModelConfig) -> nn.Module:
        """The MLP, ``(B, T, C) -> (B, T, C)``: the GELU ``MLP`` of this module."""
        return MLP(cfg)

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
        """Run one block on ``x`` of shape ``(B, T, C)``.

        Returns:
            ``x`` of shape ``(B, T, C)``, or ``(x, attn_probs)`` with
            ``return_attn=True``, ``attn_probs`` being exactly what the
            attention returned: ``(B, H, T, T)``, pre-dropout.

        Raises:
            InputError: from ``check_input`` against ``ln1``'s ``(C,)``
                weight, or from ``CausalSelfAttention.forward``.
            AttributeError, TypeError: ``ln1`` (from ``make_norm``) has no
                ``weight``, or one that is not a tensor.
        """
        check_input(x, _norm_weight(self.ln1), "block")
        if return_attn:
            attn_out, probs = self.attn(self.ln1(x), return_attn=True)  # (B, T, C), (B, H, T, T)
        else:
            attn_out, probs = self.attn(self.ln1(x)), None  # (B, T, C)
        x = x + self.dropout(attn_out)  # (B, T, C)
        x = x + self.dropout(self.mlp(self.ln2(x)))  # (B, T, C)
        if probs is not None:
            return x, probs
        return x


def _norm_weight(norm: nn.Module) -> torch.Tensor:
    """The ``(C,)`` weight of a block's norm (LayerNorm and RMSNorm both have one).

    Raises:
        AttributeError: ``norm`` has no ``weight``.
        TypeError: its ``weight`` is not a tensor (``None``: a norm without one).
    """
    weight = norm.weight  # (C,)
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"a block's norm needs a (C,) weight tensor, got {type(weight).__name__}")
    return weight


@torch.no_grad()
def init_weights(module: nn.Module) -> None:
    """GPT-style init of one module; use as ``model.apply(init_weights)``.

    - ``nn.Linear`` and ``nn.Embedding``: weight ~ Normal(0, 0.02); Linear bias 0.
    - ``nn.LayerNorm``: weight 1, bias 0 (where they exist).
    - anything else: untouched, so any module tree is safe.
    """
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)
    if isinstance(module, nn.LayerNorm):
        if module.weight is not None:
            nn.init.ones_(module.weight)
        if module.bias is not None:
            nn.init.zeros_(module.bias)
