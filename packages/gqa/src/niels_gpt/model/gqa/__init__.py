"""Grouped-query attention: the sizes a user plans with.

The attention itself is the attention stage's ``CausalSelfAttention``, which
takes ``ModelConfig.H_kv`` key/value heads; this package says what that buys
(``cache_bytes_per_token``) and which key/value head a query head reads
(``kv_head_of``). The code is in ``sizes``.
"""

from __future__ import annotations

from niels_gpt.model.gqa.sizes import cache_bytes_per_token, kv_head_of

__all__ = ["cache_bytes_per_token", "kv_head_of"]
