"""Which rows of the token arrays each optimizer step and each rank reads.

A step's global batch is ``batch_size`` windows of ``T + 1`` tokens at random
offsets drawn from a generator seeded with ``(seed, step)`` alone. The batch
therefore depends on nothing but the step: a resumed run, a run on more ranks
and a run with more accumulation all see the same global batch. The global
batch is cut into ``world * accum`` equal micro-batches; rank ``r`` takes
micro-batches ``r * accum ... r * accum + accum - 1`` in order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

__all__ = ["Layout", "eval_offsets", "read_rows", "train_offsets"]

_EVAL_SEED = 0x5EED


@dataclass(frozen=True)
class Layout:
    """How one global batch is spread over ranks and accumulation micro-steps.

    Raises:
        ValueError: ``batch_size`` is not a positive multiple of ``world * accum``,
            or ``rank`` is outside ``[0, world)``.
    """

    batch_size: int
    world: int = 1
    rank: int = 0
    accum: int = 1

    def __post_init__(self) -> None:
        for name in ("batch_size", "world", "accum"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if not 0 <= self.rank < self.world:
            raise ValueError(f"rank must be in [0, {self.world - 1}], got {self.rank}")
        if self.batch_size % (self.world * self.accum) != 0:
            raise ValueError(
                f"batch_size must be a multiple of world size x grad accumulation "
                f"({self.world} x {self.accum} = {self.world * self.accum}), "
                f"got {self.batch_size}"
            )

    @property
    def micro(self) -> int:
        """Rows in one micro-batch."""
        return self.batch_size // (self.world * self.accum)

    def rows(self, micro_step: int) -> slice:
        """This rank's rows of the global batch for accumulation step ``micro_step``."""
        if not 0 <= micro_step < self.accum:
            raise ValueError(f"micro_step must be in [0, {self.accum - 1}], got {micro_step}")
        start = (self.rank * self.accum + micro_step) * self.micro
        return slice(start, start + self.micro)


def _check_room(n_tokens: int, T: int, what: str) -> int:
    room = n_tokens - (T + 1)
    if room < 0:
        raise ValueError(
            f"the {what} split holds {n_tokens} tokens; a window needs T + 1 = {T + 1}"
        )
    return room + 1


def train_offsets(seed: int, step: int, batch_size: int, n_tokens: int, T: int) -> torch.Tensor:
    """``(batch_size,)`` int64 start offsets of step ``step``'s global batch."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    high = _check_room(n_tokens, T, "train")
    return torch.randint(0, high, (batch_size,), generator=gen)  # (batch_size,)


def eval_offsets(n_rows: int, n_tokens: int, T: int) -> torch.Tensor:
    """``(n_rows,)`` fixed validation offsets, the same for every run and step."""
    gen = torch.Generator().manual_seed(_EVAL_SEED)
    high = _check_room(n_tokens, T, "validation")
    return torch.randint(0, high, (n_rows,), generator=gen)  # (n_rows,)


def read_rows(
    tokens: np.ndarray[Any, np.dtype[np.uint8]],
    offsets: torch.Tensor,
    T: int,
    device: torch.device,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and next-token targets for windows starting at ``offsets``.

    Returns:
        ``(x, y)``, both ``(len(offsets), T)`` int64 on ``device``; ``y`` is
        ``x`` shifted by one token.
    """
    window = np.stack([np.asarray(tokens[o : o + T + 1]) for o in offsets.tolist()])  # (b, T+1)
    ids = torch.from_numpy(window.astype(np.int64)).to(device)  # (b, T+1)
    return ids[:, :-1], ids[:, 1:]  # (b, T), (b, T)
