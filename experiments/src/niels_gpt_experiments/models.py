"""The two models of the ablation, both built from the stage packages.

- **v1** is ``niels_gpt.model.gpt.GPT`` as the backbone_v1 stage ships it:
  RMSNorm, SwiGLU MLP, RoPE attention, tied head.
- **v0** is the same ``GPT`` (same token embedding, same tied, bias-free LM
  head, same forward and input checks) with its blocks replaced by the block
  stage's ``niels_gpt.model.block_v0.Block`` (LayerNorm + GELU MLP). Its final
  norm is an ``nn.LayerNorm(C, eps=1e-5)``, matching the v0 block's own norms,
  so v0 is LayerNorm throughout and v1 RMSNorm throughout.

Equal parameter count: SwiGLU has three ``C x d_ff`` matrices, GELU two, so v0
gets a wider MLP. ``matched_v0_d_ff`` picks the GELU width whose total count is
closest to v1's; biases and LayerNorm's bias leave a remainder of well under
0.1% at every size the experiment uses (both counts are printed).
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from torch import nn

from niels_gpt.config import ModelConfig
from niels_gpt.model import block_v0
from niels_gpt.model.blocks import init_weights
from niels_gpt.model.gpt import GPT

__all__ = ["GPTv0", "ModelKind", "build_model", "count_params", "matched_v0_d_ff", "n_params"]

ModelKind = Literal["v0", "v1"]
MODEL_KINDS: tuple[ModelKind, ...] = ("v0", "v1")


class GPTv0(GPT):
    """``GPT`` with v0 blocks (LayerNorm + GELU) and a LayerNorm final norm.

    Same constructor, forward, trace and tied head as ``GPT``; weights are
    initialised with the v1 ``init_weights`` (which includes the v0 rules).
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__(cfg)
        self.blocks = nn.ModuleList([block_v0.Block(cfg) for _ in range(cfg.L)])
        # GPT types ln_f as RMSNorm; v0 swaps in the LayerNorm of its blocks on purpose.
        self.ln_f = nn.LayerNorm(cfg.C, eps=1e-5)  # type: ignore[assignment]
        self.apply(init_weights)


def build_model(kind: ModelKind, cfg: ModelConfig) -> GPT:
    """A freshly initialised v0 or v1 model on the CPU, in float32.

    Raises:
        ValueError: ``kind`` is neither ``"v0"`` nor ``"v1"``.
    """
    if kind == "v1":
        return GPT(cfg)
    if kind == "v0":
        return GPTv0(cfg)
    raise ValueError(f"model kind must be 'v0' or 'v1', got {kind!r}")


def n_params(model: nn.Module) -> int:
    """Parameters of a built model; the tied embedding/head weight counts once."""
    return sum(p.numel() for p in model.parameters())


def count_params(kind: ModelKind, cfg: ModelConfig) -> int:
    """Parameter count from the layer sizes alone, without building the model."""
    C, F = cfg.C, cfg.d_ff
    kv = 2 * cfg.kv_heads * (C // cfg.H)  # key and value widths: 2 * C unless H_kv < H
    attention = (C + kv) * C + C * C  # fused qkv and proj, no biases
    if kind == "v1":
        mlp = 3 * C * F + 2 * F + C  # w_a, w_g (C -> F, bias), w_o (F -> C, bias)
        norms, final = 2 * C, C  # RMSNorm weights only
    elif kind == "v0":
        mlp = 2 * C * F + F + C  # fc (C -> F, bias), proj (F -> C, bias)
        norms, final = 4 * C, 2 * C  # LayerNorm weight and bias
    else:
        raise ValueError(f"model kind must be 'v0' or 'v1', got {kind!r}")
    return cfg.V * C + cfg.L * (attention + mlp + norms) + final


def matched_v0_d_ff(v1: ModelConfig) -> int:
    """The GELU width that brings v0's parameter count closest to v1's at ``v1.d_ff``."""
    target = count_params("v1", v1)
    base = count_params("v0", dataclasses.replace(v1, d_ff=1))
    per_unit = v1.L * (2 * v1.C + 1)  # count_params("v0") grows by this per unit of d_ff
    return max(1, round((target - base) / per_unit) + 1)
