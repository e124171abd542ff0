"""Fast path: SDPA as the kernel of the one attention, for calls that need no probabilities.

The code is in ``sdpa``; this package re-exports its public names.
"""

from __future__ import annotations

from niels_gpt.model.fastpath.sdpa import (
    FastCausalSelfAttention,
    sdpa_kernel,
    use_explicit_attention,
    use_fast_attention,
)

__all__ = ["FastCausalSelfAttention", "sdpa_kernel", "use_explicit_attention", "use_fast_attention"]
