"""The GPT v1 model: token embedding, RoPE attention blocks, tied LM head.

The code is in ``transformer``; this package re-exports its public names.
"""

from __future__ import annotations

from niels_gpt.model.gpt.transformer import GPT, AttnTrace

__all__ = ["GPT", "AttnTrace"]
