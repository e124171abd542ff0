"""fastpath's float64 reference (the fused kernel's contract) agrees with main, sees wrong kernels.

A wrong stage runs only the calls that can show its bug (``refnarrow.patched``),
to keep the file short; the honest control runs every reference call with the
stage's own references, as the verdict's reference worker loads them
(``verdict/oracle.py``), at seed 7 and at a seed drawn for the run
(``reseeded``: ``.ci/run --full``).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import refkit
import refnarrow

KERNEL = "packages/fastpath/src/niels_gpt/model/fastpath/sdpa.py"


@pytest.mark.parametrize("seed", refkit.fixed_and_drawn(7))
def test_main_agrees(tmp_path: Path, seed: int | None) -> None:
    got, want = refkit.answers("fastpath", refkit.seed_for(seed), tmp_path)
    assert refkit.judged("fastpath", got, want) == []


# name: (the calls that can show it, the text, the wrong text), all in the kernel's file
WRONG = {
    # every query sees every key of an uncached call
    "not-causal": (("fast/*",), "is_causal=True,", "is_causal=False,"),
    # scores scaled 1% too much, cached or not
    "scale-off": (("fast/*",), "scale=scale", "scale=1.01 * scale"),
    # the mask of a cached chunk aligned top-left: a chunk's later queries lose cached keys
    "cache-top-left": (("cached/f64/fast/*",), ".tril(S - T)", ".tril(0)"),
    # the KEPT attack: aligned top-left only once the cache holds 16 or more rows
    "cache-top-left-past-16": (
        ("cached/f32/fast/*",),
        ".tril(S - T)",
        ".tril(S - T if S - T < 16 else 0)",
    ),
}


@pytest.mark.parametrize("wrong", refkit.wrong_cases(sorted(WRONG), landing="scale-off"))
def test_a_wrong_stage_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrong: str) -> None:
    calls, find, replace = WRONG[wrong]
    edit = {KERNEL: lambda s: s.replace(find, replace)}
    refnarrow.patched(monkeypatch, "fastpath", calls=calls)
    got, want = refkit.answers("fastpath", 7, tmp_path, edits=edit)
    found = refkit.judged("fastpath", got, want)
    # the reference sees it (the driver's own invariants may see it too)
    assert any(v.rule == "oracle.differs" for v in found), found
