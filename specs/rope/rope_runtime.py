"""Runtime-rule drivers of the rope stage (maintainer-owned; run by ``contracts pr``)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

import niels_gpt.model.rope as rope

Record = Callable[[], AbstractContextManager[None]]


def apply_rope_calls(device: torch.device, record: Record) -> None:
    """apply_rope with matching tables, in every floating dtype the device has.

    Contiguous and strided (a transposed view) inputs, and a cache longer than
    the query, so both of apply_rope's code paths run.
    """
    torch.manual_seed(0)
    dtypes = [torch.float32, torch.bfloat16, torch.float16]
    if device.type != "mps":
        dtypes.append(torch.float64)
    for dtype in dtypes:
        sin, cos = rope.rope_cache(32, 8, device=device, dtype=dtype)  # (1, 1, 32, 4) each
        q = torch.randn(2, 4, 9, 8, device=device, dtype=dtype)  # (B, H, Tq, D)
        k = torch.randn(2, 9, 4, 8, device=device, dtype=dtype).transpose(1, 2)  # (B, H, Tq, D)
        with record():
            rope.apply_rope(q, q.clone(), sin, cos)
            rope.apply_rope(k, k, sin, cos)
