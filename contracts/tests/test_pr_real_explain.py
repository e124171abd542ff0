"""A BROKEN oracle verdict explains itself (issue 28 item 4), judged end to end.

An attention PR whose causal mask lets every position see one future token:
the harm is proved outside the gate first (``realkit``'s probe on the PR's
sources and on main's). Then the verdict must say what broke in words (a
row naming causality), fold the stages that merely call attention into one
line each, and write a reproducer that a plain process runs on the PR's
sources (exit 1, the difference printed) and on main's (exit 0).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest
from realkit import RealRepo, rows
from test_pr_real_attention import ATTN, INIT_MASK, LEAK, _mask_shifted_when

pytestmark = pytest.mark.scenario  # nox -s test-scenarios

RUN = """
import runpy
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as stop:
    print("EXIT", stop.code)
"""


def _run(repo: RealRepo, script: Path, rev: str) -> tuple[int, str]:
    """The reproducer run in a plain process on ``rev``'s stage sources: exit code, output."""
    out = repo.probe(RUN.format(script=str(script)), rev)
    found = re.search(r"^EXIT (\d+)$", out, re.MULTILINE)
    assert found, out
    return int(found.group(1)), out


def test_a_causal_mask_bug_explains_itself(real_repo: RealRepo, tmp_path: Path) -> None:
    real_repo.replace(ATTN, INIT_MASK, _mask_shifted_when("True"))  # one future token visible
    real_repo.pr("attention")
    assert float(real_repo.probe(LEAK)) > 1e-4  # the harm, outside the gate
    assert float(real_repo.probe(LEAK, "main")) == 0.0
    out_dir = tmp_path / "verdict-out"
    code, out, _ = real_repo.verdict("--skip-mutants", "--out", str(out_dir))
    assert code == 1
    assert rows(out)["oracle:cpu"] == "BROKEN"
    oracle = [v for v in out["violations"] if v["check"] == "oracle:cpu"]
    mine = [v for v in oracle if v["message"].startswith("attention: ")]
    assert any("causal" in v["message"] for v in mine), [v["message"] for v in mine]
    others = [v for v in oracle if not v["message"].startswith("attention: ")]
    assert others, "the dependants fail too: the fold has something to fold"
    assert all(v["rule"] == "oracle.follows" for v in others), others
    assert all("follows from attention" in v["message"] for v in others)
    per_stage = Counter(v["message"].split(":")[0] for v in others)
    assert set(per_stage.values()) == {1}, per_stage
    summary = next(o["summary"] for o in out["outcomes"] if o["check"] == "oracle:cpu")
    found = re.search(r"reproducer: (\S+)", summary)
    assert found, summary
    script = Path(found.group(1))
    assert script.is_file() and out_dir in script.parents
    assert "niels_gpt_contracts" not in script.read_text(encoding="utf-8")
    broken, said = _run(real_repo, script, "HEAD")
    assert broken == 1, said
    assert "max |diff|" in said and "BEYOND the bound" in said
    fixed, said = _run(real_repo, script, "main")
    assert fixed == 0, said
    assert "within the bound" in said
