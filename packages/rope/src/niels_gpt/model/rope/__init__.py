"""Rotary position embeddings (RoPE): a sin/cos cache and its application.

The code is in ``rotary``; this package re-exports its public names.
"""

from __future__ import annotations

from niels_gpt.model.rope.rotary import apply_rope, rope_cache

__all__ = ["apply_rope", "rope_cache"]
