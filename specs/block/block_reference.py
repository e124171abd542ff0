"""Float64 reference of the block stage's public API (maintainer-owned).

The oracle's reference worker loads this file in place of
``niels_gpt.model.block_v0`` for the calls ``reference_calls`` of
``specs/block.toml`` names (and for every call of a first PR of the stage).
It is written from the spec (invariants ``prenorm_wiring``,
``passes_attn_probs``, ``builders``, ``check_input``, ``mixed_precision``,
``init_weights``) and seed 001, not from the implementation:

- ``Block``: ``x + dropout(attn(ln1(x)))``, then ``x + dropout(mlp(ln2(x)))``,
  ``ln1`` and ``ln2`` being ``LayerNorm(C, eps=1e-5)`` (biased variance), one
  ``Dropout(cfg.dropout)`` for both branches, the modules built in the order
  ``ln1, attn, ln2, mlp, dropout`` (so parameter and ``state_dict`` names and
  order are the stage's, and the oracle loads the same weights).
- ``MLP``: ``Linear(C, d_ff) -> GELU (the erf form) -> Linear(d_ff, C)``, with
  biases.
- The attention is the attention stage's own ``CausalSelfAttention`` (the
  spec's dependency, which the block must call), run on float64 copies of
  its weights and tables (``torch.func.functional_call``), so that nothing
  on the way is rounded below float64.

Every number is computed in float64 from the given input and parameters,
whatever dtype or autocast region the call comes from. Only results are
rounded: the block's output to the input's dtype (the residual stream keeps
it under autocast too), the probabilities to float32 (float64 in a float64
block), the MLP's output to the autocast dtype inside autocast, else to the
input's. Bad input raises core's ``InputError`` before any work, as the spec
says (rank, width, dtype, device); a length past ``cfg.T`` is refused by the
attention. Gradients of every order flow to the parameters through the
float64 casts.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

# The worker registers this file under its module name without importing the
# parent packages; importing one here makes the name resolvable through them.
import niels_gpt.model  # noqa: F401
from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

__all__ = ["MLP", "Block", "check_input", "init_weights"]

EPS = 1e-5  # both LayerNorms' eps, as the spec fixes it


def check_input(x: torch.Tensor, weight: torch.Tensor, owner: str) -> None:
    """``x`` must be ``(B, T, C)`` with ``C = weight.shape[-1]``, in weight's dtype and device.

    Raises:
        InputError: naming what was expected and what came; nothing is cast.
    """
    if not isinstance(x, torch.Tensor) or x.ndim != 3:
        raise InputError(f"x must be (B, T, C), got {getattr(x, 'shape', type(x).__name__)}")
    if x.shape[-1] != weight.shape[-1]:
        raise InputError(f"x last dim must be {weight.shape[-1]}, got {x.shape[-1]}")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise InputError(
            f"x must be {weight.dtype} on {weight.device} like the {owner}'s parameters, "
            f"got {x.dtype} on {x.device}"
        )


def _linear(x: torch.Tensor, layer: nn.Linear) -> torch.Tensor:
    """``x @ W^T + b`` in float64; ``x`` float64 ``(..., in)`` -> ``(..., out)``."""
    y = x @ layer.weight.double().T  # (..., out)
    return y if layer.bias is None else y + layer.bias.double()


def _layer_norm(x: torch.Tensor, norm: nn.LayerNorm) -> torch.Tensor:
    """LayerNorm over the last dim of float64 ``x``: ``(x - mean) / sqrt(var + 1e-5)``
    (biased variance) times ``norm``'s weight plus its bias, one float64 op."""
    w, b = norm.weight.double(), norm.bias.double()  # (C,) each
    return F.layer_norm(x, (x.shape[-1],), w, b, EPS)  # (..., C)


def attend64(
    attn: nn.Module, h: torch.Tensor, return_attn: bool
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``attn(h, return_attn=...)`` on float64 copies of its weights and tables.

    ``h`` is float64 ``(B, T, C)``; so is the output, and the probabilities
    ``(B, H, T, T)`` are float64. The copies are differentiable casts, so
    gradients reach ``attn``'s own parameters.
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


class MLP(nn.Module):
    """``fc -> GELU -> proj``, ``(B, T, C) -> (B, T, C)``, computed in float64."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.fc = nn.Linear(cfg.C, cfg.d_ff, bias=True)
        self.act = nn.GELU()
        self.proj = nn.Linear(cfg.d_ff, cfg.C, bias=True)

    def float64(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP of float64 ``x`` ``(B, T, C)``, float64."""
        h = _linear(x, self.fc)  # (B, T, F)
        h = F.gelu(h, approximate="none")  # (B, T, F): x Phi(x), the erf form
        return _linear(h, self.proj)  # (B, T, C)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_input(x, self.fc.weight, "MLP")
        on = torch.is_autocast_enabled("cpu")
        out_dtype = torch.get_autocast_dtype("cpu") if on else x.dtype
        with torch.autocast("cpu", enabled=False):
            return self.float64(x.double()).to(out_dtype)  # (B, T, C)


class Block(nn.Module):
    """The pre-norm block of the spec, computed in float64."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.ln1 = self.make_norm(cfg)
        self.attn = CausalSelfAttention(cfg)
        self.ln2 = self.make_norm(cfg)
        self.mlp = self.make_mlp(cfg)
        self.dropout = nn.Dropout(cfg.dropout)

    def make_norm(self, cfg: ModelConfig) -> nn.Module:
        return nn.LayerNorm(cfg.C, eps=EPS)

    def make_mlp(self, cfg: ModelConfig) -> nn.Module:
        return MLP(cfg)

    def forward(
        self, x: torch.Tensor, *, return_attn: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        ln1, ln2, mlp = self.ln1, self.ln2, self.mlp
        assert isinstance(ln1, nn.LayerNorm) and isinstance(ln2, nn.LayerNorm)
        assert isinstance(mlp, MLP)
        check_input(x, ln1.weight, "block")
        probs_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
        with torch.autocast("cpu", enabled=False):
            h = x.double()  # (B, T, C)
            a = attend64(self.attn, _layer_norm(h, ln1), return_attn)
            probs = None
            if isinstance(a, tuple):
                a, probs = a  # (B, T, C), (B, H, T, T)
            h = h + self.dropout(a)  # (B, T, C)
            h = h + self.dropout(mlp.float64(_layer_norm(h, ln2)))  # (B, T, C)
            y: torch.Tensor = h.to(x.dtype)  # (B, T, C)
        if probs is not None:
            return y, probs.to(probs_dtype)
        return y


@torch.no_grad()
def init_weights(module: nn.Module) -> None:
    """Linear and Embedding weights ~ N(0, 0.02), Linear biases 0, LayerNorm 1 and 0."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        module.weight.normal_(mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        module.bias.zero_()
    if isinstance(module, nn.LayerNorm):
        if module.weight is not None:
            module.weight.fill_(1.0)
        if module.bias is not None:
            module.bias.zero_()
