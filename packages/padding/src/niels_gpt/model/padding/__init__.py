"""Left-padded batches: a padded forward, padded generation and a padded loss.

The code is in ``padded``; a padded batch's frame and the argument checks are in
the package's private ``_frame`` and ``_checks``. This package re-exports the
public names.
"""

from __future__ import annotations

from niels_gpt.model.padding.padded import (
    apply_rope_rows,
    generate,
    padded_cross_entropy,
    padded_forward,
)

__all__ = ["apply_rope_rows", "generate", "padded_cross_entropy", "padded_forward"]
