"""What a call beyond ``forward(x)`` brings: a KV cache, positions and a key mask.

Private to the attention stage. The code is in ``call``; this package re-exports
what the stage's modules use.
"""

from __future__ import annotations

from niels_gpt.model._attention_call.call import KVCache, check_call, rotate_at, rotate_rows

__all__ = ["KVCache", "check_call", "rotate_at", "rotate_rows"]
