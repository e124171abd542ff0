"""A left-padded batch's frame, handed to the attention stage's one attention.

Shape notation::

    B: batch, n: tokens in one call, p: first column of the call (0, or the
    cache length when generating), W: columns of the whole call (t + new)

Row ``b`` of a left-padded batch has ``pads[b]`` leading pads. Column ``c``
of row ``b`` is real iff ``c >= pads[b]``, and its RoPE position is
``max(c - pads[b], 0)`` (0 at the row's first real token, 0 for pads). The
attention stage's forward takes exactly that (``positions`` and a
``key_mask``, attention 1.1), while ``GPT`` and ``Block`` call it without
them; so for the length of a call every attention module gets a forward
pre-hook (torch's ``with_kwargs`` hooks) that adds the frame's positions and
key mask for the columns it computes (after the columns a KV cache holds,
when ``kv_cache.generate`` runs inside). The hooks are taken away again on
return or on an error: no module changes class, and nothing of the
attention's maths is written here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

from niels_gpt.model.attention import attention_modules

__all__ = ["RowFrame", "framed"]


class RowFrame:
    """The padding of one left-padded batch, and what each call derives from it.

    ``pads``: ``(B,)`` int64, the leading pads of each row, on the model's
    device. ``arguments(p, n)`` gives the attention keywords of columns
    ``[p, p + n)``, computed once for all layers of one forward.
    """

    def __init__(self, pads: torch.Tensor) -> None:
        self.pads = pads  # (B,)
        self._last: tuple[tuple[int, int], dict[str, torch.Tensor]] | None = None

    def arguments(self, p: int, n: int) -> dict[str, torch.Tensor]:
        """``positions`` ``(B, n)`` int64, ``key_mask`` ``(B, p+n)`` bool: columns ``[p, p+n)``."""
        if self._last is not None and self._last[0] == (p, n):
            return self._last[1]
        pads = self.pads[:, None]  # (B, 1)
        cols = torch.arange(p + n, device=pads.device)  # (p + n,) key columns
        keywords = {
            "positions": (cols[None, p:] - pads).clamp(min=0),  # (B, n)
            "key_mask": cols[None, :] >= pads,  # (B, p + n), True = a real key
        }
        self._last = ((p, n), keywords)
        return keywords


@contextmanager
def framed(model: nn.Module, frame: RowFrame) -> Iterator[None]:
    """Run every attention module of ``model`` in ``frame`` for the block.

    The model was checked (``check_model``): its attention modules run the
    attention stage's forward. A cache set up on a module inside the block
    (``kv_cache.generate`` sets up its own) is the padded frame: cache index =
    column, so each call's first column is the cache's length.
    """

    def add_frame(
        module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[tuple[Any, ...], dict[str, Any]]:
        cache = getattr(module, "kv_cache", None)
        p = 0 if cache is None else len(cache)
        return args, {**kwargs, **frame.arguments(p, args[0].shape[1])}

    handles = []
    try:
        for _, m in attention_modules(model):
            handles.append(m.register_forward_pre_hook(add_frame, with_kwargs=True))
        yield
    finally:
        for handle in handles:
            handle.remove()
