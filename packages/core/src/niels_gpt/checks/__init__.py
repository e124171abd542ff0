"""Explicit input checks shared by the model stages.

The code is in ``input_checks``; this package re-exports its public names.
"""

from __future__ import annotations

from niels_gpt.checks.input_checks import (
    InputError,
    check_features,
    check_length,
    check_like,
    is_index,
)

__all__ = ["InputError", "check_features", "check_length", "check_like", "is_index"]
