"""A reproducer for a bug that needs earlier calls in the same process (issue 50, item 3).

An attention PR memoises its RoPE tables by ``(T, D)`` only: a second module
with another ``rope_theta`` gets the first module's tables. The harm is proved
outside the gate first (two modules in one user process); the oracle must
find it, and its reproducer must replay the calls that led to the failing one
(shrunk to the shortest prefix that still fails), so that a plain process on
the PR's sources fails (exit 1) and on main's passes (exit 0). The failing
call alone, in a fresh process, would pass.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from realkit import RealRepo, rows
from test_pr_real_explain import _run

pytestmark = pytest.mark.scenario  # nox -s test-scenarios

ATTN = "packages/attention/src/niels_gpt/model/attention/causal.py"
TABLES = """        sin, cos = rope.rope_cache(
            cfg.T, self.head_dim, theta=cfg.rope_theta, device="cpu", dtype=torch.float32
        )  # (1, 1, T, D/2) each
"""
MEMO = """        key = (cfg.T, self.head_dim)
        if key not in _TABLES:  # memoised by (T, D) only: rope_theta forgotten
            _TABLES[key] = rope.rope_cache(
                cfg.T, self.head_dim, theta=cfg.rope_theta, device="cpu", dtype=torch.float32
            )
        sin, cos = (t.clone() for t in _TABLES[key])  # (1, 1, T, D/2) each
"""
# Two modules of one shape, one user process: the second theta's tables.
HARM = """
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention

a = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.0))
b = CausalSelfAttention(ModelConfig(V=2, T=16, C=8, H=2, dropout=0.0, rope_theta=123.0))
print(float((a.rope_sin - b.rope_sin).abs().max()))
"""
# A plain process that runs the reproducer with only the first ``n`` calls replayed.
RUN_SOME = """
import runpy, sys
sys.argv = [{script!r}, "--history", "{n}"]
try:
    runpy.run_path({script!r}, run_name="__main__")
except SystemExit as stop:
    print("EXIT", stop.code)
"""


def test_a_memo_that_forgets_rope_theta_gets_a_reproducer_with_its_history(
    real_repo: RealRepo, tmp_path: Path
) -> None:
    real_repo.replace(ATTN, TABLES, MEMO)
    real_repo.replace(
        ATTN,
        "\n\nclass CausalSelfAttention",
        "\n\n_TABLES: dict = {}\n\n\nclass CausalSelfAttention",
    )
    real_repo.pr("attention")
    assert float(real_repo.probe(HARM)) == 0.0  # the harm, outside the gate: one table
    assert float(real_repo.probe(HARM, "main")) > 0.1
    out_dir = tmp_path / "verdict-out"
    code, out, _ = real_repo.verdict("--skip-mutants", "--out", str(out_dir))
    assert code == 1
    assert rows(out)["oracle:cpu"] == "BROKEN"
    summary = next(o["summary"] for o in out["outcomes"] if o["check"] == "oracle:cpu")
    found = re.search(r"reproducer: (\S+)", summary)
    assert found, summary
    script = Path(found.group(1))
    assert script.is_file() and out_dir in script.parents
    history = json.loads((script.parent / "meta.json").read_text(encoding="utf-8"))["history"]
    assert history, "the failing call alone passes: it needs the calls before it"
    broken, said = _run(real_repo, script, "HEAD")
    assert broken == 1, said
    assert "BEYOND the bound" in said
    fixed, said = _run(real_repo, script, "main")
    assert fixed == 0, said
    # The shortest prefix: one call fewer and the failing call passes again.
    shorter = real_repo.probe(RUN_SOME.format(script=str(script), n=len(history) - 1))
    assert "EXIT 0" in shorter, shorter
