"""Every argument check of the padding stage, run before any work.

Private to the padding stage. The code is in ``checks``; this package re-exports
what the stage's modules use.
"""

from __future__ import annotations

from niels_gpt.model._padding_checks.checks import (
    check_generate_args,
    check_loss_args,
    check_mask,
    check_model,
    check_rope_rows,
    check_tokens,
    check_trace_layer,
)

__all__ = [
    "check_generate_args",
    "check_loss_args",
    "check_mask",
    "check_model",
    "check_rope_rows",
    "check_tokens",
    "check_trace_layer",
]
