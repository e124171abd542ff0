"""The shared input checks: boundaries and messages."""

from __future__ import annotations

import pytest
import torch

from niels_gpt.checks import InputError, check_features, check_length, check_like, is_index


@pytest.mark.invariant("core.input_checks")
def test_check_length_boundaries() -> None:
    check_length(1, 8)
    check_length(8, 8)  # t == cfg.T is allowed
    for bad in (0, 9, -1):
        with pytest.raises(InputError, match=rf"\[1, 8\].*got {bad}"):
            check_length(bad, 8)


@pytest.mark.invariant("core.input_checks")
def test_input_error_is_every_kind_a_caller_may_catch() -> None:
    for kind in (AssertionError, ValueError, TypeError):
        with pytest.raises(kind):
            check_length(0, 1)


@pytest.mark.invariant("core.input_checks")
def test_check_features_and_like_name_expected_and_actual() -> None:
    x = torch.zeros(2, 3, 4)  # (B, T, C)
    check_features(x, "x", ndim=3, last=4)
    with pytest.raises(InputError, match="3 dims, got 2"):
        check_features(x[0], "x", ndim=3, last=4)
    with pytest.raises(InputError, match=r"must be 5.*got 4"):
        check_features(x, "x", ndim=3, last=5)
    check_like(x, "x", torch.zeros(1), "m")
    with pytest.raises(InputError, match=r"torch.float64.*got torch.float32"):
        check_like(x, "x", torch.zeros(1, dtype=torch.float64), "m")
    with pytest.raises(InputError, match="meta"):
        check_like(x, "x", torch.zeros(1, device="meta"), "m")


@pytest.mark.invariant("core.input_checks")
def test_check_length_names_what_it_checks() -> None:
    """``what=`` at a non-default value is the subject of the message."""
    with pytest.raises(InputError, match=r"^prompt length must be in \[1, 4\] \(cfg.T\), got 5$"):
        check_length(5, 4, what="prompt length")
    with pytest.raises(InputError, match=r"^sequence length t must be in \[1, 4\]"):
        check_length(5, 4)


@pytest.mark.invariant("core.input_checks")
def test_is_index_takes_ints_in_the_half_open_range_only() -> None:
    assert is_index(0, 0, 3) and is_index(2, 0, 3)
    assert not is_index(3, 0, 3)  # high is excluded
    assert not is_index(-1, 0, 3)  # low is included, below it is not
    assert is_index(10**9, 1, None)  # no upper bound
    assert not is_index(0, 1, None)


@pytest.mark.invariant("core.input_checks")
@pytest.mark.parametrize("value", [True, False, 1.0, "1", None])
def test_is_index_refuses_bools_and_non_ints(value: object) -> None:
    assert not is_index(value, 0, None)
