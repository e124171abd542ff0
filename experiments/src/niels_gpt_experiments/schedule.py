"""Learning-rate schedule: linear warm-up, then cosine decay to a floor."""

from __future__ import annotations

import math

import torch

__all__ = ["WarmupCosine", "make_scheduler"]


class WarmupCosine:
    """Multiplier of the peak learning rate at optimizer step ``step`` (0-based).

    - ``step < warmup``: ``(step + 1) / warmup``, reaching 1 at the last warm-up step;
    - then a half cosine from 1 at ``warmup`` down to ``min_ratio`` at ``total``;
    - ``min_ratio`` from ``total`` on.

    A callable object rather than a lambda, so ``LambdaLR.state_dict`` keeps it
    and a checkpoint records the schedule it was made with.

    Raises:
        ValueError: ``total < 1``, ``warmup`` outside ``[0, total]`` or
            ``min_ratio`` outside ``[0, 1]``.
    """

    def __init__(self, warmup: int, total: int, min_ratio: float) -> None:
        if total < 1:
            raise ValueError(f"total steps must be >= 1, got {total}")
        if not 0 <= warmup <= total:
            raise ValueError(f"warmup must be in [0, {total}], got {warmup}")
        if not 0.0 <= min_ratio <= 1.0:
            raise ValueError(f"min_ratio must be in [0, 1], got {min_ratio}")
        self.warmup = warmup
        self.total = total
        self.min_ratio = min_ratio

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        if step >= self.total:
            return self.min_ratio
        span = max(1, self.total - self.warmup)
        progress = (step - self.warmup) / span  # in [0, 1)
        return self.min_ratio + (1.0 - self.min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def make_scheduler(
    optimizer: torch.optim.Optimizer, warmup: int, total: int, min_ratio: float
) -> torch.optim.lr_scheduler.LambdaLR:
    """``LambdaLR`` over ``WarmupCosine``; call ``step()`` once after each optimizer step."""
    return torch.optim.lr_scheduler.LambdaLR(optimizer, WarmupCosine(warmup, total, min_ratio))
