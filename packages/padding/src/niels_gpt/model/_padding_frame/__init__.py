"""A left-padded batch's frame, handed to the attention stage's one attention.

Private to the padding stage. The code is in ``frame``; this package re-exports
what the stage's modules use.
"""

from __future__ import annotations

from niels_gpt.model._padding_frame.frame import RowFrame, framed

__all__ = ["RowFrame", "framed"]
