"""The knobs of ``generate``: their checks, ``filter_logits`` and the draw.

Private to the kv_cache stage. The code is in ``sampling``; this package
re-exports what the stage's modules use.
"""

from __future__ import annotations

from niels_gpt.model._kv_sampling.sampling import (
    check_generate_args,
    check_generator,
    check_knobs,
    choose_next,
    filter_logits,
)

__all__ = ["check_generate_args", "check_generator", "check_knobs", "choose_next", "filter_logits"]
