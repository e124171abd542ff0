"""padding's domain sweeps (``domain/...``) answer on main and see a loss that overflows.

Main's code answers every domain call (an error exactly where the call is an
``errors`` case) and keeps the calls' invariants, at seed 3 and at a seed drawn
for the run (``reseeded``); a padded loss that takes its softmax without
subtracting the maximum (exact at unit-scale logits, NaN once float32 logits
are 30 times larger) differs from main.
"""

from __future__ import annotations

from pathlib import Path

import domainkit
import pytest
import refkit

STAGE = "padding"
CODE = "packages/padding/src/niels_gpt/model/padding/padded.py"
LOSS = (
    '    losses = F.cross_entropy(flat, kept, ignore_index=ignored, reduction="none")  # (B*t,)\n'
)
NAIVE = """    e = flat.exp()  # (B*t, V): no maximum subtracted
    picked = e.gather(-1, kept.clamp(min=0)[:, None])[:, 0] / e.sum(-1)  # (B*t,)
    losses = -picked.log() * (kept != ignored)  # (B*t,)
"""


def _naive(text: str) -> str:
    return text.replace(LOSS, NAIVE)


def _answered(main: domainkit.Stream) -> None:
    assert domainkit.healthy(STAGE, main) == []
    domain = {n: c for (s, n), c in main.calls.items() if s == STAGE and n.startswith("domain/")}
    assert len(domain) > 100
    wrong = {n: c.error for n, c in domain.items() if (c.error is None) == ("errors" in c.axes)}
    assert wrong == {}
    assert domainkit.judged(STAGE, main, main) == []  # every invariant holds on main


@pytest.mark.parametrize("seed", refkit.fixed_and_drawn(3))
def test_main_answers_every_domain_call(tmp_path: Path, seed: int | None) -> None:
    main, _ = domainkit.answers(STAGE, refkit.seed_for(seed), tmp_path)
    _answered(main)


def test_a_loss_without_the_max_subtraction_differs(tmp_path: Path) -> None:
    main, broken = domainkit.answers(STAGE, 7, tmp_path, edits={CODE: _naive})
    _answered(main)
    found = [v.message for v in domainkit.judged(STAGE, broken, main)]
    assert any("domain/magnitude/loss/float32/s=30 " in m for m in found), found
    assert not any("/s=1 " in m for m in found), found
