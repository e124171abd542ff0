"""``filter_logits`` and the draw against a reference written pair by pair.

The reference below never sorts: an entry survives top-k iff fewer than k
entries are strictly larger, and survives top-p iff the probability mass of
the entries ranked before it (larger probability, or equal probability and a
lower index) is below top_p. Logits come from a grid of halves, exact in every
float dtype, so ties are real ties and distinct values are far apart; top-p
cases whose decision lies within rounding of the boundary are skipped.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st

from niels_gpt.checks import InputError
from niels_gpt.model.kv_cache import filter_logits
from niels_gpt.model.kv_cache._sampling import choose_next

Tol = Callable[[torch.dtype], dict[str, float]]
NEG = float("-inf")


def pairwise_keep(
    row: list[float], temperature: float, top_k: int | None, top_p: float | None
) -> tuple[list[bool], float]:
    """Which entries survive, and the smallest distance of a top-p mass to top_p."""
    V = len(row)
    if temperature == 0:
        best = max(row)
        first = min(j for j in range(V) if row[j] == best)
        return [j == first for j in range(V)], 1.0
    scaled = [x / temperature for x in row]
    keep = [True] * V
    if top_k is not None:
        keep = [sum(1 for y in scaled if y > x) < top_k for x in scaled]
    margin = 1.0
    if top_p is not None:
        top = max(x for x, kept in zip(scaled, keep, strict=True) if kept)
        weights = [math.exp(x - top) if kept else 0.0 for x, kept in zip(scaled, keep, strict=True)]
        probs = [w_ / sum(weights) for w_ in weights]
        for j in range(V):
            before = sum(
                probs[i]
                for i in range(V)
                if probs[i] > probs[j] or (probs[i] == probs[j] and i < j)
            )
            margin = min(margin, abs(before - top_p))
            keep[j] = keep[j] and before < top_p
    return keep, margin


def reference_filter(
    logits: torch.Tensor, temperature: float, top_k: int | None, top_p: float | None
) -> tuple[torch.Tensor, float]:
    """The filtered ``(..., V)`` logits in their dtype, and the top-p margin of all rows."""
    rows = logits.detach().to("cpu", torch.float64).reshape(-1, logits.shape[-1]).tolist()
    results = [pairwise_keep(r, temperature, top_k, top_p) for r in rows]
    keep = torch.tensor([k for k, _ in results], dtype=torch.bool, device=logits.device)
    keep = keep.reshape(logits.shape)  # (..., V)
    values = logits if temperature == 0 else logits / temperature  # (..., V)
    return values.masked_fill(~keep, NEG), min((m for _, m in results), default=1.0)


def _grid_logits(
    shape: tuple[int, ...], seed: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    halves = torch.randint(-8, 9, shape, generator=gen).double() / 2  # (..., V) in [-4, 4]
    return halves.to(device=device, dtype=dtype)


@pytest.mark.invariant("kv_cache.filter_matches_reference")
@given(
    lead=st.lists(st.integers(1, 3), max_size=2),
    V=st.integers(1, 20),
    temperature=st.sampled_from([0.0, 0.5, 1.0, 1.7, 3]),
    top_k=st.none() | st.integers(1, 24),
    top_p=st.none() | st.floats(0.05, 1.0),
    seed=st.integers(0, 2**16),
    data=st.data(),
)
def test_filter_matches_the_pairwise_reference(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    tol: Tol,
    lead: list[int],
    V: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
    data: st.DataObject,
) -> None:
    dtype = data.draw(st.sampled_from(float_dtypes))
    logits = _grid_logits((*lead, V), seed, device, dtype)  # (..., V)
    before = logits.clone()
    want, margin = reference_filter(logits, temperature, top_k, top_p)
    assume(margin > 1e-4)  # no top-p decision within float32 rounding of the boundary
    got = filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p)
    assert got.shape == logits.shape and got.dtype == dtype and got.device == logits.device
    assert torch.equal(logits, before)
    assert torch.equal(got == NEG, want == NEG)
    kept = want != NEG
    torch.testing.assert_close(got[kept], want[kept], **tol(dtype))
    assert bool(kept.any(-1).all())  # every row keeps at least its most likely entry


@pytest.mark.invariant("kv_cache.filter_matches_reference")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_filter_runs_in_half_precision_too(device: torch.device, dtype: torch.dtype) -> None:
    logits = torch.tensor([[2.0, -1.0, 0.5, 2.0], [0.0, 1.0, 3.0, -2.0]], device=device)
    got = filter_logits(logits.to(dtype), temperature=0.5, top_k=2)
    assert got.dtype == dtype
    want = torch.tensor([[4.0, NEG, NEG, 4.0], [NEG, 2.0, 6.0, NEG]], device=device, dtype=dtype)
    torch.testing.assert_close(got, want, rtol=0, atol=0)


@pytest.mark.invariant("kv_cache.filter_matches_reference")
def test_integer_knobs_mean_their_float_values(device: torch.device) -> None:
    logits = _grid_logits((3, 9), 4, device, torch.float32)  # (3, V)
    torch.testing.assert_close(
        filter_logits(logits, temperature=2, top_p=1),
        filter_logits(logits, temperature=2.0, top_p=1.0),
        rtol=0,
        atol=0,
    )
    torch.testing.assert_close(filter_logits(logits, top_p=1), logits, rtol=0, atol=0)


@pytest.mark.invariant("kv_cache.sampling_exact")
@given(
    B=st.integers(1, 4),
    V=st.integers(2, 12),
    temperature=st.sampled_from([0.3, 1.0, 2.2]),
    top_k=st.none() | st.integers(1, 12),
    top_p=st.none() | st.floats(0.1, 1.0),
    seed=st.integers(0, 2**16),
)
def test_the_draw_is_one_multinomial_over_all_rows(
    device: torch.device,
    float_dtypes: tuple[torch.dtype, ...],
    B: int,
    V: int,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    seed: int,
) -> None:
    dtype = float_dtypes[-1]
    logits = _grid_logits((B, V), seed, device, dtype) / 4  # (B, V), flat: several in play
    want_logits, margin = reference_filter(logits, temperature, top_k, top_p)
    assume(margin > 1e-6)
    gen = torch.Generator(device=device).manual_seed(seed)
    want = torch.multinomial(torch.softmax(want_logits, -1), 1, generator=gen)[:, 0]  # (B,)
    gen.manual_seed(seed)
    got = choose_next(logits, temperature=temperature, top_k=top_k, top_p=top_p, generator=gen)
    assert got.shape == (B,) and got.dtype == torch.int64
    assert torch.equal(got, want)
    assert bool((want_logits.gather(1, got[:, None]) != NEG).all())  # drawn from kept entries


@pytest.mark.invariant("kv_cache.greedy_matches_loop")
def test_temperature_zero_takes_the_first_maximum_and_draws_nothing(device: torch.device) -> None:
    logits = torch.tensor([[1.0, 5.0, 5.0, 0.0], [7.0, -1.0, 7.0, 7.0]], device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    state = gen.get_state()
    got = choose_next(logits, temperature=0.0, top_k=1, top_p=0.5, generator=gen)
    assert got.tolist() == [1, 0]
    assert torch.equal(gen.get_state(), state)


@pytest.mark.invariant("kv_cache.rejects_bad_input")
@pytest.mark.parametrize(
    "knobs",
    [
        {"temperature": -1},
        {"temperature": float("-inf")},
        {"temperature": None},
        {"temperature": False},
        {"top_k": 1.5},
        {"top_k": "3"},
        {"top_k": False},
        {"top_p": 1.000001},
        {"top_p": float("inf")},
        {"top_p": "0.5"},
        {"top_p": False},
    ],
)
def test_filter_names_the_bad_knob(device: torch.device, knobs: dict[str, object]) -> None:
    (name, value), *_ = knobs.items()
    with pytest.raises(InputError, match=name) as caught:
        filter_logits(torch.zeros(1, 4, device=device), **knobs)  # type: ignore[arg-type]
    assert repr(value) in str(caught.value)  # the actual value, next to the expected range


@pytest.mark.invariant("kv_cache.rejects_bad_input")
def test_filter_rejects_logits_without_a_vocabulary(device: torch.device) -> None:
    with pytest.raises(InputError, match="got shape"):
        filter_logits(torch.zeros(3, 0, device=device))
    with pytest.raises(InputError, match=r"torch\.Tensor"):
        filter_logits([[0.0, 1.0]])  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"torch\.bool"):
        filter_logits(torch.zeros(2, 3, dtype=torch.bool, device=device))
