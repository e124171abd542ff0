"""Transformer block v1: RMSNorm, SwiGLU MLP, pre-norm wiring.

Shape notation::

    B: batch, T: sequence length, C: width, F: MLP hidden width (cfg.d_ff)

This is the seed path ``niels_gpt/model/blocks.py`` at its latest stage.
``CausalSelfAttention`` is re-exported unchanged from the attention stage; the
v0 block (LayerNorm + GELU) stays importable as ``niels_gpt.model.block_v0``,
and the v1 ``Block`` is that block with other parts (its builders overridden).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from niels_gpt.checks import InputError, check_like
from niels_gpt.config import ModelConfig
from niels_gpt.model import block_v0
from niels_gpt.model.attention import CausalSelfAttention

__all__ = ["MLP", "Block", "CausalSelfAttention", "RMSNorm", "init_weights"]


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dim, with a weight and no bias::

        y = x / sqrt(mean(x**2, dim=-1) + eps) * weight

    Input and output are ``(..., dim)``.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"RMSNorm dim must be a positive int, got {dim!r}")
        if not eps > 0:
            raise ValueError(f"RMSNorm eps must be > 0, got {eps!r}")
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Normalise ``x`` of shape ``(..., dim)``.

        Raises:
            InputError: the last dim of ``x`` is not ``dim``, or its dtype or
                device differ from ``weight``'s.
        """
        if x.ndim < 1 or x.shape[-1] != self.dim:
            raise InputError(
                f"RMSNorm input last dim must be {self.dim}, got shape {tuple(x.shape)}"
            )
        check_like(x, "x", self.weight, "RMSNorm")  # no silent promotion to the weight dtype
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return x / rms * self.weight  # (..., dim)

    def extra_repr(self) -> str:
        return f"{self.dim}, eps={self.eps}"


class MLP(nn.Module):
    """SwiGLU MLP: ``w_o(silu(w_g(x)) * w_a(x))``, all three Linear with bias.

    ``w_a``, ``w_g``: ``C -> d_ff``; ``w_o``: ``d_ff -> C``. Input and output are
    ``(B, T, C)``.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_a = nn.Linear(cfg.C, cfg.d_ff, bias=True)
        self.w_g = nn.Linear(cfg.C, cfg.d_ff, bias=True)
        self.w_o = nn.Linear(cfg.d_ff, cfg.C, bias=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Map ``(B, T, C)`` to ``(B, T, C)``.

        Raises:
            InputError: from ``block_v0.check_input`` against ``w_a``'s
                ``(F, C)`` weight.
        """
        block_v0.check_input(x, self.w_a.weight, "MLP")
        a = self.w_a(x)  # (B, T, F)
        g = self.w_g(x)  # (B, T, F)
        h = F.silu(g) * a  # (B, T, F)
        out: torch.Tensor = self.w_o(h)  # (B, T, C)
        return out


class Block(block_v0.Block):
    """Pre-norm residual block v1, one dropout shared by both branches::

        x = x + dropout(attn(ln1(x)))
        x = x + dropout(mlp(ln2(x)))

    The v0 block's wiring, input checks and construction order, with other
    parts: ``ln1``/``ln2`` are ``RMSNorm(C, eps=1e-5)``; ``mlp`` is the SwiGLU
    ``MLP``. Input and output are ``(B, T, C)``; ``forward(x, return_attn=True)``
    also returns the attention's own ``(B, H, T, T)`` pre-dropout
    probabilities. Bad input raises ``InputError`` (see ``block_v0.Block``).
    """

    def make_norm(self, cfg: ModelConfig) -> nn.Module:
        """One of the two norms, ``(B, T, C) -> (B, T, C)``: ``RMSNorm(C, eps=1e-5)``."""
        return RMSNorm(cfg.C, eps=1e-5)

    def make_mlp(self, cfg: ModelConfig) -> nn.Module:
        """The MLP, ``(B, T, C) -> (B, T, C)``: the SwiGLU ``MLP``."""
        return MLP(cfg)


@torch.no_grad()
def init_weights(module: nn.Module) -> None:
    """The v0 init (Linear/Embedding ~ Normal(0, 0.02), biases 0, LayerNorm 1/0),
    plus ``RMSNorm`` weights set to 1. Use as ``model.apply(init_weights)``.
    """
    block_v0.init_weights(module)
    if isinstance(module, RMSNorm):
        nn.init.ones_(module.weight)
