"""fastpath's domain sweeps (``domain/...``) answer on main and see a kernel wrong under autocast.

Main's code answers every domain call (an error exactly where the call is an
``errors`` case) and keeps the calls' invariants (each fast answer equal to the
explicit path's), at seed 3 and at a seed drawn for the run (``reseeded``); a
kernel that drops the causal mask only under bfloat16 autocast differs from
main.
"""

from __future__ import annotations

from pathlib import Path

import domainkit
import pytest
import refkit

STAGE = "fastpath"
CODE = "packages/fastpath/src/niels_gpt/model/fastpath/sdpa.py"
FIRST = "    T, S = q.shape[-2], k.shape[-2]\n"
SKEWED = """    if torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, scale=scale)
"""  # noqa: E501 (the inserted source line)


def _skewed(text: str) -> str:
    return text.replace(FIRST, FIRST + SKEWED)


def _answered(main: domainkit.Stream) -> None:
    assert domainkit.healthy(STAGE, main) == []
    domain = {n: c for (s, n), c in main.calls.items() if s == STAGE and n.startswith("domain/")}
    assert len(domain) > 80
    wrong = {n: c.error for n, c in domain.items() if (c.error is None) == ("errors" in c.axes)}
    assert wrong == {}
    assert domainkit.judged(STAGE, main, main) == []  # every invariant holds on main


@pytest.mark.parametrize("seed", refkit.fixed_and_drawn(3))
def test_main_answers_every_domain_call(tmp_path: Path, seed: int | None) -> None:
    main, _ = domainkit.answers(STAGE, refkit.seed_for(seed), tmp_path)
    _answered(main)


def test_a_kernel_wrong_under_bfloat16_autocast_differs(tmp_path: Path) -> None:
    main, broken = domainkit.answers(STAGE, 7, tmp_path, edits={CODE: _skewed})
    _answered(main)
    found = [v.message for v in domainkit.judged(STAGE, broken, main)]
    assert any("call domain/dtype/autocast-bf16 " in m for m in found), found
    assert not any("domain/dtype/f32 " in m or "domain/dtype/autocast-f16 " in m for m in found)
