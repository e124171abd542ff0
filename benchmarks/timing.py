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


def paired_ratios(
    first: Callable[[], object],
    second: Callable[[], object],
    device: torch.device,
    *,
    pairs: int,
) -> list[float]:
    """``second``'s seconds over ``first``'s, one ratio per pair of calls run back to back.

    A slow spell of a shared machine that lasts longer than one pair slows both
    calls of that pair alike, so the ratio of a pair moves far less than either
    time does across pairs. The order within a pair alternates, so neither
    candidate always runs on the caches the other left warm. No warm-up here:
    the caller has run both before.
    """
    if pairs < 1:
        raise ValueError(f"pairs must be >= 1, got {pairs}")
    ratios: list[float] = []
    for i in range(pairs):
        seconds: dict[int, float] = {}
        for which in (0, 1) if i % 2 == 0 else (1, 0):
            sync(device)
            t0 = time.perf_counter()
            (first, second)[which]()
            sync(device)
            seconds[which] = time.perf_counter() - t0
        ratios.append(seconds[1] / seconds[0])
    return ratios
