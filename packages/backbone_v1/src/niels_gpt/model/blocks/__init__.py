"""Transformer block v1: RMSNorm, SwiGLU MLP, pre-norm wiring.

The code is in ``layers``; this package re-exports its public names.
"""

from __future__ import annotations

from niels_gpt.model.blocks.layers import MLP, Block, CausalSelfAttention, RMSNorm, init_weights

__all__ = ["MLP", "Block", "CausalSelfAttention", "RMSNorm", "init_weights"]
