"""Causal multi-head self-attention with rotary position embeddings: the one attention.

The code is in ``causal``; what a call beyond ``forward(x)`` brings (``KVCache``,
the checks of a call) is in the package's private ``_call``. This package
re-exports the public names.
"""

from __future__ import annotations

from niels_gpt.model.attention.causal import (
    AttentionKernel,
    CausalSelfAttention,
    KVCache,
    attention_modules,
    rotate_rows,
)

__all__ = ["AttentionKernel", "CausalSelfAttention", "KVCache", "attention_modules", "rotate_rows"]
