"""kv_cache's float64 reference agrees with main on its reference calls and sees wrong stages.

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

SAMPLING = "packages/kv_cache/src/niels_gpt/model/kv_cache/_sampling.py"
GENERATE = "packages/kv_cache/src/niels_gpt/model/kv_cache/cache.py"


@pytest.mark.parametrize("seed", refkit.fixed_and_drawn(7))
def test_main_agrees(tmp_path: Path, seed: int | None) -> None:
    got, want = refkit.answers("kv_cache", refkit.seed_for(seed), tmp_path)
    assert refkit.judged("kv_cache", got, want) == []


# name: (the calls that can show it, the file, the text, the wrong text)
WRONG = {
    # the cached decode step is fed the token before the last: the cache is one position off
    "cache-one-off": (
        ("generate/*",),
        GENERATE,
        "x = ids[:, col : col + 1]",
        "x = ids[:, col - 1 : col]",
    ),
    "temperature-multiplies": (
        ("filter/*",),
        SAMPLING,
        "scaled = logits / temperature",
        "scaled = logits * temperature",
    ),
    "top-k-off-by-one": (
        ("filter/*", "generate/*"),
        SAMPLING,
        "torch.topk(scaled, top_k, dim=-1)",
        "torch.topk(scaled, top_k + 1, dim=-1)",
    ),
    # sampled generation draws from the global generator, not the one given
    "generator-ignored": (
        ("generate/*",),
        SAMPLING,
        "num_samples=1, generator=generator)",
        "num_samples=1)",
    ),
}


@pytest.mark.parametrize(
    "wrong", refkit.wrong_cases(sorted(WRONG), landing="temperature-multiplies")
)
def test_a_wrong_stage_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, wrong: str) -> None:
    calls, path, find, replace = WRONG[wrong]
    edit = {path: lambda s: s.replace(find, replace)}
    refnarrow.patched(monkeypatch, "kv_cache", calls=calls)
    got, want = refkit.answers("kv_cache", 7, tmp_path, edits=edit)
    found = refkit.judged("kv_cache", got, want)
    # the reference sees it (the driver's own invariants may see it too)
    assert any(v.rule == "oracle.differs" for v in found), found
