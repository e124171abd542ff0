"""Weight-only int8 for a model's linear layers, one scale per output channel.

The code is in ``int8``; this package re-exports its public names.
"""

from __future__ import annotations

from niels_gpt.model.quant.int8 import Int8Linear, quantize_int8, quantize_linear, quantize_weight

__all__ = ["Int8Linear", "quantize_int8", "quantize_linear", "quantize_weight"]
