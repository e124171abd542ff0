"""The v0 block's float64 reference agrees with main and sees wrong blocks.

Each wrong stage is one of ``specs/block.toml``'s catalogued mutants, applied
as the mutant runner applies it (a stale ``find`` fails the test). Seed 7
runs every reference call, the domain sweeps' included (they load the
maintainers' oracle sweeps from ``specs/_kit/``, one folder up); a seed drawn
for the run (``reseeded``, which ``.ci/run --full`` runs) and the wrong stages
run the calls outside ``domain/...``: those are the calls whose configs,
lengths and dtypes the seed draws (the domain sweeps have fixed shapes), and
they leave out the 2100-call history loop, which keeps the file near a minute
of CPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import refkit
from refnarrow import mutant_edit, patched

STAGE = "block"
SEEDED = ("config*", "mixed/*", "mlp", "bad/*")  # every call outside domain/...
SMALL = ("config1/*", "bad/*")  # a drawn config without dropout, in f32 and f64; bad inputs


def test_main_agrees_on_every_call(tmp_path: Path) -> None:
    got, want = refkit.answers(STAGE, 7, tmp_path)
    assert len(want.calls) >= 80, want.driver_errors
    raised = sorted(n for (_, n), c in want.calls.items() if c.error == "TypeError")
    assert raised == [], raised  # the domain sweeps ran (block 2.0 asks with return_attn)
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
            "post-norm",  # the norms after the residual adds
            "tanh-gelu",  # GELU's tanh approximation
            "layernorm-eps",  # LayerNorm eps 1e-6
            "check-input-dtype-device-unchecked",  # a float64 input reaches a float32 block
        ],
        landing="post-norm",
    ),
)
def test_a_wrong_block_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mutant: str
) -> None:
    patched(monkeypatch, STAGE, calls=SMALL)
    got, want = refkit.answers(STAGE, 7, tmp_path, edits=mutant_edit(STAGE, mutant))
    found = refkit.judged(STAGE, got, want)
    assert found and all(v.rule == "oracle.differs" for v in found), found
