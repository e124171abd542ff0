"""Warm-up then cosine decay, checked against its formula's landmarks."""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt_experiments.schedule import WarmupCosine, make_scheduler


@given(total=st.integers(1, 500), data=st.data(), floor=st.floats(0.0, 1.0))
def test_shape_of_the_schedule(total: int, data: st.DataObject, floor: float) -> None:
    warmup = data.draw(st.integers(0, total))
    f = WarmupCosine(warmup, total, floor)
    values = [f(s) for s in range(total + 3)]
    if warmup:
        assert values[:warmup] == pytest.approx([(s + 1) / warmup for s in range(warmup)])
    assert values[warmup] == pytest.approx(1.0) or warmup == total
    decay = values[warmup : total + 1]
    assert all(a >= b - 1e-12 for a, b in itertools.pairwise(decay))  # never rises
    assert values[total:] == pytest.approx([floor] * 3)
    assert all(0.0 < v <= 1.0 + 1e-12 for v in values[:warmup])
    assert all(floor - 1e-12 <= v <= 1.0 + 1e-12 for v in values[warmup:])


def test_landmarks() -> None:
    f = WarmupCosine(10, 110, 0.1)
    assert f(0) == pytest.approx(0.1) and f(9) == pytest.approx(1.0)
    assert f(10) == pytest.approx(1.0)
    assert f(60) == pytest.approx(0.1 + 0.9 * 0.5)  # half way: cos(pi / 2) = 0
    assert f(35) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 4)))
    assert f(110) == pytest.approx(0.1)


def test_scheduler_drives_the_optimizer_and_keeps_its_settings_in_state() -> None:
    p = torch.nn.Parameter(torch.zeros(2))
    opt = torch.optim.AdamW([p], lr=0.5)
    sched = make_scheduler(opt, warmup=2, total=4, min_ratio=0.2)
    seen = []
    for _ in range(5):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    assert seen == pytest.approx([0.25, 0.5, 0.5, 0.5 * (0.2 + 0.8 * 0.5), 0.1])
    state = sched.state_dict()
    assert state["lr_lambdas"] == [{"warmup": 2, "total": 4, "min_ratio": 0.2}]


def test_bad_schedules_are_rejected_with_the_value() -> None:
    with pytest.raises(ValueError, match="total steps must be >= 1, got 0"):
        WarmupCosine(0, 0, 0.1)
    with pytest.raises(ValueError, match=r"warmup must be in \[0, 5\], got 6"):
        WarmupCosine(6, 5, 0.1)
    with pytest.raises(ValueError, match=r"min_ratio must be in \[0, 1\], got 1.5"):
        WarmupCosine(1, 5, 1.5)
