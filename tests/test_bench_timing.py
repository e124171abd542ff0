"""``benchmarks.timing.paired_ratios`` on a clock of its own: no test here times anything.

The fake clock advances only when a candidate runs, by what that candidate
costs in that pair, so each ratio is known exactly and a machine that slows
down between pairs is one number in a list.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import torch
from benchmarks import timing

CPU = torch.device("cpu")


class Clock:
    """``time.perf_counter`` for the module under test: it moves when a candidate runs."""

    def __init__(self) -> None:
        self.now = 0.0
        self.calls: list[str] = []

    def __call__(self) -> float:
        return self.now

    def candidate(self, name: str, seconds: list[float]) -> Callable[[], None]:
        def run() -> None:
            self.now += seconds[len([c for c in self.calls if c == name])]
            self.calls.append(name)

        return run


def test_each_ratio_is_the_second_over_the_first_within_one_pair(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)  # the module reads time.perf_counter
    # the machine is 3x slower in the second pair: both candidates alike
    plain = clock.candidate("plain", [1.0, 3.0, 1.0])
    padded = clock.candidate("padded", [1.02, 3.12, 0.99])
    got = timing.paired_ratios(plain, padded, CPU, pairs=3)
    assert got == pytest.approx([1.02, 1.04, 0.99])


def test_the_order_within_a_pair_alternates(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock()
    monkeypatch.setattr(time, "perf_counter", clock)  # the module reads time.perf_counter
    a = clock.candidate("a", [1.0] * 4)
    b = clock.candidate("b", [2.0] * 4)
    assert timing.paired_ratios(a, b, CPU, pairs=4) == [2.0] * 4
    assert clock.calls == ["a", "b", "b", "a", "a", "b", "b", "a"]


@pytest.mark.parametrize("pairs", [0, -1])
def test_at_least_one_pair(pairs: int) -> None:
    with pytest.raises(ValueError, match=f"pairs must be >= 1, got {pairs}"):
        timing.paired_ratios(lambda: None, lambda: None, CPU, pairs=pairs)
