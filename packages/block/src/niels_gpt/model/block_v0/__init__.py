"""Transformer block v0: pre-norm LayerNorm wiring, GELU MLP, GPT-style init.

The code is in ``block``; this package re-exports its public names.
"""

from __future__ import annotations

from niels_gpt.model.block_v0.block import MLP, Block, check_input, init_weights

__all__ = ["MLP", "Block", "check_input", "init_weights"]
