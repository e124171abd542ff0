"""Median timings, taken interleaved so that load drift hits every candidate alike."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch


def matmul(a: torch.Tensor, b: torch.Tensor) -> Callable[[], torch.Tensor]:
    """``a @ b`` as a candidate for ``measure`` (the float32 matmul peak)."""
    return lambda: a @ b


def sync(device: torch.device) -> None:
    """Wait for queued kernels, so wall-clock time covers the work."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "mps":
        torch.mps.synchronize()


@dataclass
class Stat:
    """Seconds per call: the median over rounds and every round's value."""

    median: float
    rounds: list[float]

    @property
    def spread(self) -> float:
        """(max - min) / median over the rounds."""
        return (max(self.rounds) - min(self.rounds)) / self.median

    def as_dict(self) -> dict[str, object]:
        return {"median_s": self.median, "rounds_s": self.rounds, "spread": self.spread}


def measure(
    fns: Mapping[str, Callable[[], object]],
    device: torch.device,
    *,
    rounds: int,
    warmup: int = 2,
    min_sample_s: float = 0.2,
) -> dict[str, Stat]:
    """Time each callable: ``warmup`` calls, then ``rounds`` rounds.

    In every round each candidate runs back to back (A, B, C, A, B, C, ...), each
    sample repeating the call enough times to last ``min_sample_s`` (with 0, one
    call a sample, and no call spent finding out). Returns the median seconds per
    call for each name.
    """
    number: dict[str, int] = {}
    for name, fn in fns.items():
        for _ in range(warmup):
            fn()
        sync(device)
        if min_sample_s <= 0:
            number[name] = 1
            continue
        t0 = time.perf_counter()
        fn()
        sync(device)
        once = max(time.perf_counter() - t0, 1e-6)
        number[name] = max(1, round(min_sample_s / once))
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            sync(device)
            t0 = time.perf_counter()
            for _ in range(number[name]):
                fn()
            sync(device)
            samples[name].append((time.perf_counter() - t0) / number[name])
    return {name: Stat(statistics.median(s), s) for name, s in samples.items()}
