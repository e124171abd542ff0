"""Generation through per-layer KV caches: prefill once, then one token a step.

The code is in ``cache``; the knobs' checks, ``filter_logits`` and the draw are in
the package's private ``_sampling``. This package re-exports the public names.
"""

from __future__ import annotations

from niels_gpt.model.kv_cache.cache import (
    KVCache,
    KVCacheAttention,
    check_generator,
    check_knobs,
    drop_kv_cache,
    filter_logits,
    generate,
    generate_until_eos,
    use_kv_cache,
)

__all__ = [
    "KVCache",
    "KVCacheAttention",
    "check_generator",
    "check_knobs",
    "drop_kv_cache",
    "filter_logits",
    "generate",
    "generate_until_eos",
    "use_kv_cache",
]
