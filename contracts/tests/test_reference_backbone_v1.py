"""Backbone v1's float64 references agree with main and see wrong models.

Each wrong stage is one of ``specs/backbone_v1.toml``'s catalogued mutants,
applied as the mutant runner applies it (a stale ``find`` fails the test).
Seed 7 runs every reference call; a seed drawn for the run (``reseeded``,
which ``.ci/run --full`` runs) and the wrong stages run calls outside
``domain/...``, those whose configs, lengths and dtypes the seed draws (the
domain sweeps have fixed shapes), which leaves out the 2100-call history loop.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import refkit
from refnarrow import mutant_edit, patched

STAGE = "backbone_v1"
SEEDED = ("config*", "mixed/*", "parts/*", "bad/*")  # every call outside domain/...
SMALL = ("config1/*", "bad/*")  # a drawn config without dropout, in f32 and f64; bad inputs


def test_main_agrees_on_every_call(tmp_path: Path) -> None:
    got, want = refkit.answers(STAGE, 7, tmp_path)
    assert len(want.calls) >= 100 and any(n.startswith("domain/") for _, n in want.calls)
    assert refkit.judged(STAGE, got, want) == []


@pytest.mark.reseeded
def test_main_agrees_on_a_drawn_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    patched(monkeypatch, STAGE, calls=SEEDED)
    got, want = refkit.answers(STAGE, refkit.drawn_seed(), tmp_path)
    assert len(want.calls) >= 20
    assert refkit.judged(STAGE, got, want) == []


@pytest.mark.parametrize(
    "mutant",
    refkit.wrong_cases(
        [
            "swiglu-gate-swapped",  # silu(a) * g
            "head-untied",  # lm_head keeps a weight of its own
            "final-norm-eps",  # ln_f with eps 1e-6
            "trace-first-row",  # attn_row from the first query
        ],
        landing="trace-first-row",
    ),
)
def test_a_wrong_model_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    patched(monkeypatch, STAGE, calls=SMALL)
    got, want = refkit.answers(STAGE, 7, tmp_path, edits=mutant_edit(STAGE, mutant))
    found = refkit.judged(STAGE, got, want)
    assert found and all(v.rule == "oracle.differs" for v in found), found
