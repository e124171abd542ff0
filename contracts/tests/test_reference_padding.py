"""padding's float64 reference agrees with main on its reference calls and sees wrong stages.

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

PADDING = "packages/padding/src/niels_gpt/model/padding/padded.py"
FRAME = "packages/padding/src/niels_gpt/model/padding/_frame.py"


@pytest.mark.parametrize("seed", refkit.fixed_and_drawn(7))
def test_main_agrees(tmp_path: Path, seed: int | None) -> None:
    got, want = refkit.answers("padding", refkit.seed_for(seed), tmp_path)
    assert refkit.judged("padding", got, want) == []


# name: (the calls that can show it, the file, the text, the wrong text)
WRONG = {
    # every key is real to the attention: real queries attend to their row's pads
    "pad-attended": (
        "forward[1-9]*",
        FRAME,
        '"key_mask": cols[None, :] >= pads',
        '"key_mask": (cols[None, :] >= pads) | (cols[None, :] >= 0)',
    ),
    # decode steps (a cache already filled) attend to the row's pads; prefill and forward do not
    "pad-attended-in-decode": (
        "generate/*",
        FRAME,
        '"key_mask": cols[None, :] >= pads',
        '"key_mask": (cols[None, :] >= pads) | (p > 0)',
    ),
    # padded columns keep whatever the model computed there
    "pads-not-zeroed": (
        "forward[1-9]*",
        PADDING,
        "logits = out.masked_fill(~mask[:, :, None], 0.0)",
        "logits = out",
    ),
    # the loss is a mean over rows, not over counted tokens
    "loss-per-row": (
        "loss/*",
        PADDING,
        "counted = attention_mask.sum().clamp(min=1)",
        "counted = attention_mask.shape[0]",
    ),
}


@pytest.mark.parametrize(
    "wrong", refkit.wrong_cases(sorted(WRONG), landing="pad-attended-in-decode")
)
def test_a_wrong_stage_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrong: str) -> None:
    calls, path, find, replace = WRONG[wrong]
    edit = {path: lambda s: s.replace(find, replace)}
    refnarrow.patched(monkeypatch, "padding", calls=(calls,))
    got, want = refkit.answers("padding", 7, tmp_path, edits=edit)
    found = refkit.judged("padding", got, want)
    # the reference sees it (the driver's own invariants may see it too)
    assert any(v.rule == "oracle.differs" for v in found), found
