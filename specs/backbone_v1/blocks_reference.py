"""Float64 reference of backbone_v1's blocks module (maintainer-owned).

The oracle's reference worker loads this file in place of
``niels_gpt.model.blocks`` (with ``gpt_reference.py`` beside it in place of
``niels_gpt.model.gpt``) for the calls ``reference_calls`` of
``specs/backbone_v1.toml`` names. It is written from the spec (invariants
``rmsnorm_no_bias``, ``rmsnorm_matches_reference``, ``prenorm_wiring``,
``dropout_placement``, ``swiglu_matches_reference``, ``init_weights``) and
seed 004, not from the implementation:

- ``RMSNorm(dim, eps=1e-5)``: a ``(dim,)`` weight, no bias;
  ``x / sqrt(mean(x ** 2, last dim) + eps) * weight``.
- ``MLP`` (SwiGLU): ``w_o(silu(w_g(x)) * w_a(x))``, all three Linear with bias,
  ``w_a`` and ``w_g`` ``C -> d_ff``, ``w_o`` ``d_ff -> C``, built in that order.
- ``Block``: ``x + dropout(attn(ln1(x)))``, then ``x + dropout(mlp(ln2(x)))``,
  both norms ``RMSNorm(C, eps=1e-5)``, one dropout for both branches, built
  ``ln1, attn, ln2, mlp, dropout`` (parameter names and order as the stage's,
  so the oracle's seeded weights land on the same parameters).
- ``CausalSelfAttention`` is the attention stage's own class (the spec says
  the same object); a block runs it on float64 copies of its weights and
  tables (``torch.func.functional_call``).

Every number is computed in float64 from the given input and parameters,
whatever dtype or autocast region the call comes from; only results are
rounded: ``RMSNorm`` and ``Block`` to the input's dtype (autocast leaves
both in it), ``MLP`` to the autocast dtype inside autocast (its Linear
layers are what autocast lowers), else the input's, the probabilities to
float32 (float64 in a float64 block). Bad input raises core's
``InputError`` (rank, width, dtype, device); a length past ``cfg.T`` is
refused by the attention.
"""

from __future__ import annotations

import torch
from torch import nn

# The worker registers this file under its module name without importing the
# parent packages; importing one here makes the name resolvable through them.
import niels_gpt.model  # noqa: F401
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

__all__ = ["MLP", "Block", "CausalSelfAttention", "RMSNorm", "init_weights"]

REFERENCE = True  # gpt_reference.py checks that it builds on this file, not on the stage's
EPS = 1e-5  # every RMSNorm's eps in the v1 model, as the spec fixes it


def _check(x: torch.Tensor, weight: torch.Tensor, owner: str, ndim: int | None) -> None:
    """``x`` of rank ``ndim`` (any rank >= 1 if None), last dim ``weight.shape[-1]``, in
    weight's dtype and on its device; InputError naming both sides otherwise."""
    if not isinstance(x, torch.Tensor) or x.ndim < 1 or (ndim is not None and x.ndim != ndim):
        raise InputError(
            f"{owner}: x must have {ndim or '>= 1'} dims, got {getattr(x, 'shape', x)}"
        )
    if x.shape[-1] != weight.shape[-1]:
        raise InputError(f"{owner}: x last dim must be {weight.shape[-1]}, got {x.shape[-1]}")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise InputError(
            f"{owner}: x must be {weight.dtype} on {weight.device}, got {x.dtype} on {x.device}"
        )


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``x @ W^T + b`` in float64; ``x`` float64 ``(..., in)`` -> ``(..., out)``."""
    y = x @ layer.weight.double().T  # (..., out)
    return y if layer.bias is None else y + layer.bias.double()


def _autocast_or(dtype: torch.dtype) -> torch.dtype:
    """The dtype a Linear layer returns: autocast's inside an autocast region, else ``dtype``."""
    return torch.get_autocast_dtype("cpu") if torch.is_autocast_enabled("cpu") else dtype


def attend64(
    attn: nn.Module, h: torch.Tensor, return_attn: bool
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``attn(h, return_attn=...)`` on float64 copies of its weights and tables.

    ``h`` is float64 ``(B, T, C)``; so are the output and the probabilities
    ``(B, H, T, T)``. The copies are differentiable casts, so gradients of
    every order reach ``attn``'s own parameters.
    """
    state: dict[str, torch.Tensor] = dict(attn.named_parameters())
    state.update({name: b for name, b in attn.named_buffers() if b.is_floating_point()})
    out: torch.Tensor | tuple[torch.Tensor, torch.Tensor]
    if all(t.dtype == torch.float64 for t in state.values()):  # a float64 module already
        out = attn(h, return_attn=return_attn)
        return out
    wide = {name: t.double() for name, t in state.items()}
    out = torch.func.functional_call(attn, wide, (h,), {"return_attn": return_attn})
    return out


class RMSNorm(nn.Module):
    """Root-mean-square norm over the last dim, ``(..., dim)``; weight, no bias."""

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ValueError(f"RMSNorm dim must be a positive int, got {dim!r}")
        if not eps > 0:
            raise ValueError(f"RMSNorm eps must be > 0, got {eps!r}")
        self.dim = dim
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def float64(self, x: torch.Tensor) -> torch.Tensor:
        """The norm of float64 ``x`` ``(..., dim)``, float64."""
        rms = torch.sqrt(x.square().mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return x / rms * self.weight.double()  # (..., dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check(x, self.weight, "RMSNorm", None)
        with torch.autocast("cpu", enabled=False):
            y: torch.Tensor = self.float64(x.double()).to(x.dtype)  # (..., dim)
        return y


class MLP(nn.Module):
    """SwiGLU, ``(B, T, C) -> (B, T, C)``, computed in float64."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w_a = nn.Linear(cfg.C, cfg.d_ff, bias=True)
        self.w_g = nn.Linear(cfg.C, cfg.d_ff, bias=True)
        self.w_o = nn.Linear(cfg.d_ff, cfg.C, bias=True)

    def float64(self, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU of float64 ``x`` ``(B, T, C)``, float64."""
        g = _linear(x, self.w_g)  # (B, T, F)
        h = g * torch.sigmoid(g) * _linear(x, self.w_a)  # (B, T, F): silu(g) * a
        return _linear(h, self.w_o)  # (B, T, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check(x, self.w_a.weight, "MLP", 3)
        out_dtype = _autocast_or(x.dtype)
        with torch.autocast("cpu", enabled=False):
            y: torch.Tensor = self.float64(x.double()).to(out_dtype)  # (B, T, C)
        return y


class Block(nn.Module):
    """The v1 pre-norm block of the spec, computed in float64."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = RMSNorm(cfg.C, eps=EPS)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = RMSNorm(cfg.C, eps=EPS)
        self.mlp = MLP(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def float64(
        self, h: torch.Tensor, return_attn: bool
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The block on float64 ``h`` ``(B, T, C)``: float64 ``(h, probs or None)``."""
        a = attend64(self.attn, self.ln1.float64(h), return_attn)
        probs = None
        if isinstance(a, tuple):
            a, probs = a  # (B, T, C), (B, H, T, T)
        h = h + self.dropout(a)  # (B, T, C)
        h = h + self.dropout(self.mlp.float64(self.ln2.float64(h)))  # (B, T, C)
        return h, probs

    def forward(
        self, x: torch.Tensor, *, return_attn: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        _check(x, self.ln1.weight, "block", 3)
        probs_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.autocast("cpu", enabled=False):
            h, probs = self.float64(x.double(), return_attn)  # (B, T, C), (B, H, T, T)
            y: torch.Tensor = h.to(x.dtype)  # (B, T, C)
        if probs is not None:
            return y, probs.to(probs_dtype)
        return y


@torch.no_grad()
def init_weights(module: nn.Module) -> None:
    """Linear and Embedding weights ~ N(0, 0.02), Linear biases 0, norm weights 1
    (LayerNorm biases 0)."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.normal_(mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        module.bias.zero_()
    if isinstance(module, (nn.LayerNorm, RMSNorm)) and module.weight is not None:
        module.weight.fill_(1.0)
    if isinstance(module, nn.LayerNorm) and module.bias is not None:
        module.bias.zero_()
