"""Acceptance tests of ``filter_logits`` on fixed logits (stage kv_cache).

The reference (``kv_cache_kit``) is written from the spec's definitions, one row at a time
in float64 with Python loops: scale by 1/temperature, keep the entries at or
above the k-th largest, then keep each entry whose preceding probability mass
(descending order, ties by index) is below top_p. Hand-made rows pin the
boundaries (the entry that crosses top_p, ties at the k-th value, top-p after
top-k, temperature before top-p); property tests compare random rows.
"""

from __future__ import annotations

import math

import kv_cache_kit as kit
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.model.kv_cache import filter_logits

rig = kit.rig  # the bundled fixtures (speckit.acceptance.Rig), found by pytest here


NEG = float("-inf")


def _row(values: list[float], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.tensor([values], dtype=dtype, device=device)  # (1, V)


def _kept(out: torch.Tensor) -> list[int]:
    return torch.nonzero(out[0] != NEG).flatten().tolist()


def _log_probs(probs: list[float]) -> list[float]:
    return [math.log(p) for p in probs]


@pytest.mark.invariant("kv_cache.filter_matches_reference")
def test_top_k_keeps_k_largest_and_ties(rig: kit.Rig) -> None:
    for dtype in rig.float_dtypes:
        row = _row([3.0, 1.0, 4.0, 1.5, 5.0, 9.0, 2.0, 6.0], rig.device, dtype)
        assert _kept(filter_logits(row, top_k=3)) == [4, 5, 7]
        assert _kept(filter_logits(row, top_k=1)) == [5]
        assert _kept(filter_logits(row, top_k=8)) == list(range(8))
        assert _kept(filter_logits(row, top_k=50)) == list(range(8))  # k >= V keeps all
        tied = _row([1.0, 3.0, 3.0, 2.0, 3.0], rig.device, dtype)
        assert _kept(filter_logits(tied, top_k=2)) == [1, 2, 4]  # every tie at the k-th stays
        assert _kept(filter_logits(tied, top_k=4)) == [1, 2, 3, 4]


@pytest.mark.invariant("kv_cache.filter_matches_reference")
def test_top_p_keeps_the_entry_that_crosses(rig: kit.Rig) -> None:
    # Probabilities 0.5, 0.2, 0.15, 0.1, 0.05 in shuffled slots.
    probs = [0.1, 0.5, 0.05, 0.2, 0.15]
    for dtype in rig.float_dtypes:
        row = _row(_log_probs(probs), rig.device, dtype)
        assert _kept(filter_logits(row, top_p=0.45)) == [1]  # 0.5 alone crosses 0.45
        assert _kept(filter_logits(row, top_p=0.55)) == [1, 3]  # 0.5 < 0.55: 0.2 crosses
        assert _kept(filter_logits(row, top_p=0.75)) == [1, 3, 4]  # 0.7 < 0.75: 0.15 crosses
        assert _kept(filter_logits(row, top_p=0.9)) == [0, 1, 3, 4]
        assert _kept(filter_logits(row, top_p=0.99)) == [0, 1, 2, 3, 4]
        assert _kept(filter_logits(row, top_p=1.0)) == [0, 1, 2, 3, 4]
        assert _kept(filter_logits(row, top_p=0.01)) == [1]  # the top entry always stays
        # Equal probabilities: the lower index comes first in the order.
        tied = _row([1.0, 2.0, 2.0, 0.0], rig.device, dtype)  # p = .147, .3995, .3995, .054
        assert _kept(filter_logits(tied, top_p=0.3)) == [1]
        assert _kept(filter_logits(tied, top_p=0.7)) == [1, 2]
        assert _kept(filter_logits(tied, top_p=0.85)) == [0, 1, 2]


@pytest.mark.invariant("kv_cache.filter_matches_reference")
def test_top_p_mass_is_taken_after_top_k(rig: kit.Rig) -> None:
    # After top_k=2 the survivors renormalise to 0.571, 0.429: top_p=0.5 keeps one.
    # Measured before top-k (0.4, 0.3, ...) it would keep two.
    for dtype in rig.float_dtypes:
        row = _row(_log_probs([0.3, 0.4, 0.1, 0.2]), rig.device, dtype)
        assert _kept(filter_logits(row, top_k=2, top_p=0.5)) == [1]
        assert _kept(filter_logits(row, top_k=2, top_p=0.6)) == [0, 1]
        assert _kept(filter_logits(row, top_k=3, top_p=0.95)) == [0, 1, 3]


@pytest.mark.invariant("kv_cache.filter_matches_reference")
def test_temperature_divides_before_top_p(rig: kit.Rig) -> None:
    for dtype in rig.float_dtypes:
        row = _row([2.0, -1.0, 0.5], rig.device, dtype)
        out = filter_logits(row, temperature=0.5)
        torch.testing.assert_close(out, _row([4.0, -2.0, 1.0], rig.device, dtype), rtol=0, atol=0)
        out = filter_logits(row, temperature=4.0)
        torch.testing.assert_close(
            out, _row([0.5, -0.25, 0.125], rig.device, dtype), rtol=0, atol=0
        )
        # p = 0.5, 0.3, 0.2; at temperature 2 they flatten to 0.415, 0.322, 0.263.
        # top_p = 0.45: unscaled keeps one entry, scaled keeps two.
        probs = _row(_log_probs([0.5, 0.3, 0.2]), rig.device, dtype)
        assert _kept(filter_logits(probs, top_p=0.45)) == [0]
        assert _kept(filter_logits(probs, temperature=2.0, top_p=0.45)) == [0, 1]
        # At temperature 0.5 they sharpen to 0.658, 0.237, 0.105: top_p = 0.6 keeps one.
        assert _kept(filter_logits(probs, top_p=0.6)) == [0, 1]
        assert _kept(filter_logits(probs, temperature=0.5, top_p=0.6)) == [0]


@pytest.mark.invariant("kv_cache.filter_matches_reference")
def test_temperature_zero_keeps_the_first_maximum_unscaled(rig: kit.Rig) -> None:
    for dtype in rig.float_dtypes:
        logits = torch.tensor(
            [[1.0, 3.0, 3.0, 2.0], [-5.0, -7.0, -1.0, -1.0]], dtype=dtype, device=rig.device
        )  # (2, 4)
        for top_k, top_p in ((None, None), (3, None), (None, 0.2), (2, 0.9)):
            out = filter_logits(logits, temperature=0.0, top_k=top_k, top_p=top_p)
            want = torch.full_like(logits, NEG)  # (2, 4)
            want[0, 1], want[1, 2] = 3.0, -1.0
            torch.testing.assert_close(out, want, rtol=0, atol=0)


@pytest.mark.invariant("kv_cache.filter_matches_reference")
def test_filter_keeps_shape_dtype_device_and_input(rig: kit.Rig) -> None:
    gen = torch.Generator().manual_seed(3)
    for dtype in rig.float_dtypes:
        logits = torch.randn(2, 3, 11, generator=gen).to(
            device=rig.device, dtype=dtype
        )  # (2, 3, V)
        before = logits.clone()
        out = filter_logits(logits, temperature=0.7, top_k=6, top_p=0.8)
        assert out.shape == logits.shape and out.dtype == dtype and out.device == logits.device
        assert torch.equal(logits, before)  # the input is not modified
        flat = filter_logits(logits.reshape(6, 11), temperature=0.7, top_k=6, top_p=0.8)
        assert torch.equal(out.reshape(6, 11), flat)  # leading dims are rows
        assert torch.equal(flat, kit.reference_filter(logits.reshape(6, 11), 0.7, 6, 0.8))


def _margin_ok(
    rows: list[list[float]], temperature: float, top_k: int | None, top_p: float
) -> bool:
    """No top-p decision within float32 rounding of the boundary."""
    for row in rows:
        _, masses = kit.reference_keep(row, temperature, top_k, top_p)
        if any(abs(m - top_p) < 1e-4 for m in masses):
            return False
    return True


@pytest.mark.invariant("kv_cache.filter_matches_reference")
@given(
    B=st.integers(1, 3),
    V=st.integers(1, 24),
    temperature=st.sampled_from([0.0, 0.3, 1.0, 2.5]),
    top_k=st.none() | st.integers(1, 30),
    top_p=st.none() | st.floats(0.02, 1.0),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_filter_matches_reference_on_random_rows(
    rig: kit.Rig,
    B: int,
    V: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(rig.float_dtypes))
    # Distinct logits a clear gap apart, so no order depends on rounding.
    gen = torch.Generator().manual_seed(seed)
    base = torch.arange(V, dtype=torch.float64) * 0.37 - 3.0  # (V,) a 0.37 gap apart
    rows = torch.stack([base[torch.randperm(V, generator=gen)] for _ in range(B)])  # (B, V)
    logits = rows.to(device=rig.device, dtype=dtype)  # (B, V)
    if top_p is not None:
        assume(_margin_ok(logits.double().cpu().tolist(), temperature, top_k, top_p))
    out = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    want = kit.reference_filter(logits, temperature, top_k, top_p)
    assert torch.equal(out == NEG, want == NEG)
    finite = want != NEG
    rig.close(out[finite], want[finite], dtype)


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize(
    "knobs",
    [
        {"temperature": -0.1},
        {"temperature": float("nan")},
        {"temperature": float("inf")},
        {"temperature": True},
        {"temperature": "1.0"},
        {"top_k": 0},
        {"top_k": -2},
        {"top_k": True},
        {"top_k": 2.0},
        {"top_p": 0.0},
        {"top_p": -0.5},
        {"top_p": 1.5},
        {"top_p": float("nan")},
        {"top_p": True},
    ],
)
def test_filter_rejects_bad_knobs(device: torch.device, knobs: dict[str, object]) -> None:
    logits = torch.zeros(2, 5, device=device)  # (2, V)
    with pytest.raises(InputError):
        filter_logits(logits, **knobs)  # type: ignore[arg-type]


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_filter_rejects_non_float_or_scalar_logits(device: torch.device) -> None:
    with pytest.raises(InputError):
        filter_logits(torch.zeros(2, 5, dtype=torch.int64, device=device))
    with pytest.raises(InputError):
        filter_logits(torch.tensor(1.0, device=device))  # 0-d: no vocabulary dim
