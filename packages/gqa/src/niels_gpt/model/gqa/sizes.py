"""KV cache bytes a token and the key/value head of each query head, from a ``ModelConfig``.

``H`` query heads share ``H_kv = cfg.kv_heads`` key/value heads in groups of
``G = H // H_kv``: query head ``h`` reads key/value head ``h // G``. A KV cache
holds, for each of the ``L`` layers, keys and values of ``H_kv`` heads of
``D = C // H`` channels a token.
"""

from __future__ import annotations

import torch

from niels_gpt.checks import InputError
from niels_gpt.config import ModelConfig

__all__ = ["cache_bytes_per_token", "kv_head_of"]


def cache_bytes_per_token(cfg: ModelConfig, dtype: torch.dtype = torch.float32) -> int:
    """Bytes one token of one sequence takes in a model's KV cache: ``L * 2 * H_kv * D * itemsize``.

    32768 for the default model in float32 (``H_kv = H = 8``), 8192 at ``H_kv = 2``.

    Raises:
        InputError: ``dtype`` is not a floating ``torch.dtype``.
    """
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise InputError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    return cfg.L * 2 * cfg.kv_heads * cfg.head_dim * dtype.itemsize


def kv_head_of(cfg: ModelConfig, head: int) -> int:
    """The key/value head query head ``head`` reads: ``head // (H // H_kv)``.

    Raises:
        InputError: ``head`` is not an int in ``[0, H)`` (``bool`` refused).
    """
    if isinstance(head, bool) or not isinstance(head, int) or not 0 <= head < cfg.H:
        raise InputError(f"head must be an int in [0, {cfg.H}), got {head!r}")
    return head // (cfg.H // cfg.kv_heads)
