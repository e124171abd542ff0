"""What the reference tests need beside ``refkit`` (tests only): catalogued mutants as
edits, and a stage's reference calls narrowed or run on a copy of its driver.

``refkit.answers`` runs every call ``reference_calls`` names with the spec's
own driver; ``patched`` makes it run fewer (the calls a seed draws, or one
config for a wrong stage) or a driver copy, by replacing ``refkit.specs``
for one test through ``monkeypatch``.
"""

from __future__ import annotations

import dataclasses
from fnmatch import fnmatchcase
from pathlib import Path

import pytest
import refkit

from niels_gpt_contracts.mutants.catalogue import apply, catalogue


def mutant_edit(stage: str, mutant_id: str) -> dict[str, refkit.Edit]:
    """``refkit.answers``' edits for the catalogued mutant ``stage.mutant_id``, applied as
    the mutant runner applies it: a ``find`` that no longer matches fails the test."""
    (mutant,) = [m for m in catalogue(refkit.specs()[stage]) if m.id == mutant_id]

    def edit(text: str) -> str:
        applied = apply(mutant, text)
        assert applied.source is not None, applied.stale
        return applied.source

    return {mutant.file: edit}


def patched(
    monkeypatch: pytest.MonkeyPatch,
    stage: str,
    *,
    calls: tuple[str, ...] | None = None,
    driver: Path | None = None,
) -> None:
    """Make ``refkit`` run only ``calls`` (fnmatch patterns, each within one of the
    spec's reference-call patterns; default: the spec's reference calls) of
    ``stage``, with the driver file of that name in the folder ``driver`` if given
    (a copy of the stage's driver folder)."""
    full = refkit.specs()
    spec = full[stage]
    assert spec.oracle is not None and spec.oracle.reference_calls
    oracle = spec.oracle
    if calls is not None:
        outside = [
            c for c in calls if not any(fnmatchcase(c, r) for r in spec.oracle.reference_calls)
        ]
        assert not outside, f"{outside} are not among {stage}'s reference calls"
        oracle = dataclasses.replace(oracle, reference_calls=calls)
    if driver is not None:
        name = Path(oracle.driver_file).name
        oracle = dataclasses.replace(oracle, driver=f"{driver / name}:{oracle.function}")
    stages = {**full, stage: dataclasses.replace(spec, oracle=oracle)}
    monkeypatch.setattr(refkit, "specs", lambda: stages)
