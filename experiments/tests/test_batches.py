"""Batches: a step's global batch depends on (seed, step) only and is split exactly."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt_experiments.batches import Layout, eval_offsets, read_rows, train_offsets


@given(world=st.integers(1, 4), accum=st.integers(1, 4), micro=st.integers(1, 3))
def test_ranks_and_micro_steps_cover_the_global_batch_once(
    world: int, accum: int, micro: int
) -> None:
    batch = world * accum * micro
    seen: list[int] = []
    for rank in range(world):
        layout = Layout(batch, world, rank, accum)
        assert layout.micro == micro
        for m in range(accum):
            seen.extend(range(batch)[layout.rows(m)])
    assert seen == list(range(batch))  # every row once, rank-major, in order


def test_layout_rejects_a_batch_that_does_not_divide() -> None:
    with pytest.raises(
        ValueError, match=r"multiple of world size x grad accumulation \(2 x 3 = 6\), got 8"
    ):
        Layout(8, world=2, rank=0, accum=3)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 1\], got 2"):
        Layout(4, world=2, rank=2)
    with pytest.raises(ValueError, match="micro_step must be in"):
        Layout(4, accum=2).rows(2)


@given(seed=st.integers(0, 1000), step=st.integers(0, 10_000), T=st.integers(1, 64))
def test_offsets_depend_on_seed_and_step_only_and_stay_in_range(
    seed: int, step: int, T: int
) -> None:
    n = 500
    a = train_offsets(seed, step, 8, n, T)
    torch.manual_seed(123)  # the global RNG plays no part
    b = train_offsets(seed, step, 8, n, T)
    assert torch.equal(a, b) and a.dtype == torch.int64
    assert int(a.min()) >= 0 and int(a.max()) + T + 1 <= n
    assert not torch.equal(a, train_offsets(seed, step + 1, 8, n, T))


def test_eval_offsets_are_fixed() -> None:
    assert torch.equal(eval_offsets(16, 1000, 32), eval_offsets(16, 1000, 32))


def test_rows_are_windows_and_targets_shift_by_one(device: torch.device) -> None:
    tokens = np.arange(200, dtype=np.uint8)
    offsets = torch.tensor([0, 17, 150])
    x, y = read_rows(tokens, offsets, 8, device)
    assert x.shape == y.shape == (3, 8) and x.dtype == torch.int64 and x.device.type == device.type
    for row, start in enumerate(offsets.tolist()):
        assert x[row].tolist() == list(range(start, start + 8))
        assert y[row].tolist() == list(range(start + 1, start + 9))


def test_a_split_shorter_than_a_window_is_an_error() -> None:
    with pytest.raises(ValueError, match=r"holds 8 tokens; a window needs T \+ 1 = 9"):
        train_offsets(0, 0, 2, 8, 8)
