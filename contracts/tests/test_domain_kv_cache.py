"""kv_cache's domain sweeps (``domain/...``) answer on main and see a generate that leaks state.

Main's code answers every domain call (an error exactly where the call is an
``errors`` case) and keeps the calls' invariants, at seed 3 and at a seed drawn
for the run (``reseeded``); a generate that leaves its caches on the model once
it has run 500 times differs from main.
"""

from __future__ import annotations

from pathlib import Path

import domainkit
import pytest
import refkit

STAGE = "kv_cache"
CODE = "packages/kv_cache/src/niels_gpt/model/kv_cache/cache.py"


def _leaky(text: str) -> str:
    """generate counts its calls on the model and, from the 501st, keeps its caches on."""
    start = "    knobs = (temperature, top_k, top_p)\n    check_generate_args("
    count = '    model.n_calls = getattr(model, "n_calls", 0) + 1\n'
    return text.replace(start, count + start).replace(
        "        finally:\n            _restore(saved)",
        "        finally:\n            if model.n_calls <= 500:\n                _restore(saved)",
    )


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


def test_a_generate_leaking_its_caches_after_500_calls_differs(tmp_path: Path) -> None:
    main, broken = domainkit.answers(STAGE, 7, tmp_path, edits={CODE: _leaky})
    _answered(main)
    found = domainkit.judged(STAGE, broken, main)
    assert found and {v.rule for v in found} <= {"oracle.differs", "oracle.invariant"}, found
    assert all("domain/history/" in v.message for v in found), [v.message for v in found]
