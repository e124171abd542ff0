"""Model configuration shared by every niels_gpt stage.

The code is in ``model_config`` (``ModelConfig``); this package re-exports it.
"""

from __future__ import annotations

from niels_gpt.config.model_config import ModelConfig

__all__ = ["ModelConfig"]
