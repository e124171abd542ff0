"""Precision mutants: a loosened tolerance, with the code right, is named (``tests.weakened``).

The PR loosens attention's test from ``1e-9`` to ``1e-4``: every catalogued bug
that changes the numbers a lot (``no-scale``) is still caught by the loosened
test, so without a precision mutant the loosening changes no mutant's fate and
the PR is KEPT. With ``precision-1e-6`` in the base's catalogue (attention's
output 1e-6 too large), the base's test kills it and the PR's does not:
``tests.weakened`` names it. The scenario repository keeps only the mutants
``realkit.KEEP_MUTANTS`` names; the base commit here adds the precision one
from this checkout's spec, as a maintainer's amendment would.
"""

from __future__ import annotations

import pytest
from realkit import KEEP_MUTANTS, ROOT, RealRepo, rows, strip_mutants

pytestmark = pytest.mark.scenario

ATTN_TEST = "packages/attention/tests/test_attention.py"
SPEC = "specs/attention.toml"


def _catalogue(real_repo: RealRepo, extra: tuple[str, ...]) -> None:
    """Put ``extra`` mutants of this checkout's spec into the base's catalogue."""
    real_repo.git("checkout", "-q", "main")
    text = (ROOT / SPEC).read_text(encoding="utf-8")
    real_repo.write(SPEC, strip_mutants(text, (*KEEP_MUTANTS["attention"], *extra)))
    real_repo.commit("attention: the precision mutants\n\nSpec: attention")
    real_repo.git("checkout", "-q", "-B", "pr", "main")


@pytest.mark.parametrize("precise", [False, True], ids=["without", "with-precision-1e-6"])
def test_a_tolerance_loosened_to_1e_4_is_named(real_repo: RealRepo, precise: bool) -> None:
    _catalogue(real_repo, ("precision-1e-6",) if precise else ())
    test = real_repo.read(ATTN_TEST)
    assert test.count("rtol=1e-9, atol=1e-9") == 2
    real_repo.write(ATTN_TEST, test.replace("rtol=1e-9, atol=1e-9", "rtol=1e-4, atol=1e-4"))
    real_repo.pr("attention", "looser attention test")
    # Outside the gate: a 1e-6 relative error now passes the PR's comparison, not the base's.
    probe = (
        "import torch\ny = torch.randn(2, 10, 8, dtype=torch.float64)\n"
        "for tol in ({tol}):\n"
        "    try:\n"
        "        torch.testing.assert_close(y * (1 + 1e-6), y, rtol=tol, atol=tol)\n"
        "        print('passes')\n"
        "    except AssertionError:\n"
        "        print('fails')\n"
    )
    assert real_repo.probe(probe.format(tol="1e-4,")).split() == ["passes"]
    assert real_repo.probe(probe.format(tol="1e-9,"), "main").split() == ["fails"]
    code, out, _ = real_repo.verdict()
    weakened = [v for v in out["violations"] if v["rule"] == "tests.weakened"]
    assert rows(out)["mutants"] == "KEPT"  # the code is right
    if not precise:  # the loosening is invisible to the catalogue of big bugs
        assert code == 0, out["violations"]
        assert weakened == []
        return
    assert code == 1, out["violations"]
    assert len(weakened) == 1 and "precision-1e-6" in weakened[0]["message"], weakened
    assert ATTN_TEST in weakened[0]["message"]
