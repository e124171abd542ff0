"""Acceptance tests of block 1.5: ``check_input``, the input check of the block's modules.

``check_input(x, weight, owner)`` takes ``C`` from ``weight.shape[-1]`` (a
norm's ``(C,)`` weight, or the ``(out, C)`` weight of the Linear that reads
``x``) and refuses, with an ``InputError`` naming what it expected and what
came, any ``x`` that is not ``(B, T, C)`` in the weight's dtype and on its
device. It never casts: the accepted input is left as it came.
"""

from __future__ import annotations

import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.model.block_v0 import check_input

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def _weight(C: int, out: int | None, dtype: torch.dtype) -> torch.Tensor:
    """A norm's ``(C,)`` weight (``out`` None) or a Linear's ``(out, C)`` one."""
    shape = (C,) if out is None else (out, C)
    return torch.nn.Parameter(torch.ones(shape, dtype=dtype))


@pytest.mark.invariant("block.check_input")
@given(
    B=st.integers(1, 3),
    T=st.integers(1, 5),
    C=st.integers(1, 9),
    out=st.none() | st.integers(1, 9),
    dtype=st.sampled_from(DTYPES),
    owner=st.sampled_from(["block", "MLP", "my norm"]),
)
def test_accepts_b_t_c_like_the_weight_and_casts_nothing(
    B: int, T: int, C: int, out: int | None, dtype: torch.dtype, owner: str
) -> None:
    weight = _weight(C, out, dtype)
    x = torch.randn(B, T, C).to(dtype)  # (B, T, C)
    before = x.clone()
    assert check_input(x, weight, owner) is None
    assert x.dtype == dtype and torch.equal(x, before)


@pytest.mark.invariant("block.check_input")
@given(
    C=st.integers(2, 9),
    out=st.none() | st.integers(1, 9),
    shape=st.sampled_from(["2-D", "4-D", "1-D", "wider", "narrower"]),
)
def test_refuses_a_wrong_rank_or_width_naming_both(C: int, out: int | None, shape: str) -> None:
    weight = _weight(C, out, torch.float32)
    x = {
        "2-D": torch.randn(3, C),
        "4-D": torch.randn(1, 2, 3, C),
        "1-D": torch.randn(C),
        "wider": torch.randn(2, 3, C + 1),
        "narrower": torch.randn(2, 3, C - 1),
    }[shape]
    with pytest.raises(InputError) as info:
        check_input(x, weight, "MLP")
    message = str(info.value)
    if x.ndim != 3:
        assert f"must have 3 dims, got {x.ndim} dims" in message
    else:
        assert re.search(rf"last dim must be {C}\b.*got {x.shape[-1]}\b", message), message


@pytest.mark.invariant("block.check_input")
@given(
    weight_dtype=st.sampled_from(DTYPES),
    x_dtype=st.sampled_from([*DTYPES, torch.int64]),
    owner=st.sampled_from(["block", "MLP"]),
)
def test_refuses_another_dtype_naming_both_and_the_owner(
    weight_dtype: torch.dtype, x_dtype: torch.dtype, owner: str
) -> None:
    weight = _weight(4, 6, weight_dtype)
    x = torch.zeros(2, 3, 4, dtype=x_dtype)  # (B, T, C)
    if x_dtype == weight_dtype:
        check_input(x, weight, owner)
        return
    with pytest.raises(InputError) as info:
        check_input(x, weight, owner)
    assert str(info.value) == (
        f"x dtype must match the {owner} parameters ({weight_dtype}), got {x_dtype}"
    )


@pytest.mark.invariant("block.check_input")
def test_refuses_another_device_naming_both(device: torch.device) -> None:
    weight = _weight(4, None, torch.float32).to(device)
    x = torch.empty(2, 3, 4, device="meta")  # (B, T, C) on no real device
    with pytest.raises(InputError) as info:
        check_input(x, weight, "block")
    assert str(info.value) == (
        f"x device must match the block parameters ({weight.device}), got meta"
    )
    check_input(torch.zeros(2, 3, 4, device=device), weight, "block")
