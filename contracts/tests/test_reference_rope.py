"""RoPE's float64 reference agrees with main on its reference calls and sees wrong rotations.

Each wrong stage is one of ``specs/rope.toml``'s catalogued mutants, applied
as the mutant runner applies it, so an edit that no longer matches the code
fails here instead of passing for nothing.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import refkit
from refnarrow import mutant_edit

STAGE = "rope"


@pytest.mark.parametrize("seed", refkit.fixed_and_drawn(7))
def test_main_agrees(tmp_path: Path, seed: int | None) -> None:
    got, want = refkit.answers(STAGE, refkit.seed_for(seed), tmp_path)
    assert len(want.calls) > 50, sorted(want.calls)  # every axis but the errors is answered
    assert refkit.judged(STAGE, got, want) == []


@pytest.mark.parametrize(
    "mutant",
    refkit.wrong_cases(
        [
            "exponent-missing-two",  # the frequencies: theta ** (-i / D)
            "half-split-pairing",  # channels paired (i, i + D/2)
            "cache-sliced-from-end",  # a long table read from its end
            "complex-turn-swapped",  # only the complex path: sin + i cos
        ],
        landing="exponent-missing-two",
    ),
)
def test_a_wrong_rope_differs(tmp_path: Path, mutant: str) -> None:
    got, want = refkit.answers(STAGE, 7, tmp_path, edits=mutant_edit(STAGE, mutant))
    found = refkit.judged(STAGE, got, want)
    assert found and all(v.rule == "oracle.differs" for v in found), found
