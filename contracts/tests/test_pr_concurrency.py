"""Verdicts that share one ``--cache-dir`` at once (two worktrees, a runner with two jobs).

The sandbox environment is built by one of them under a file lock while the
other waits and then reuses it; proven kills are merged into the cache file
under a lock and renamed into place. Here two ``contracts pr`` processes
start a moment apart on a cold cache, so the environment (torch and all,
from this repository's ``constraints.txt``) really is built, once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from prkit import PrRepo

ROOT = Path(__file__).resolve().parents[2]
ROPE = "packages/rope/src/ngt/model/rope.py"
RUNS = 2


@pytest.mark.scenario  # builds a sandbox env with torch: nox -s test-scenarios
def test_verdicts_started_together_on_a_cold_cache_share_it(pr_repo: PrRepo) -> None:
    pr_repo.write("constraints.txt", (ROOT / "constraints.txt").read_text())
    pr_repo.git("add", "-A")
    pr_repo.git("commit", "-qm", "pin the sandbox's tools")
    pr_repo.git("branch", "-f", "main")
    pr_repo.replace(ROPE, "def rotate(", '"""Turning."""\n\n\ndef rotate(')
    pr_repo.pr("rope")
    contracts = str(Path(sys.executable).with_name("contracts"))
    args = [
        contracts, "pr", "--repo", str(pr_repo.root), "--base", "main", "--head", "HEAD",
        "--cache-dir", str(pr_repo.cache), "--jobs", "1", "--format", "json",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    runs = []
    for _ in range(RUNS):
        runs.append(
            subprocess.Popen(
                args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
        time.sleep(0.5)
    done = [(p.wait(timeout=1200), *p.communicate()) for p in runs]
    for code, out, err in done:
        assert code == 0, (out[-2000:], err[-2000:])
        assert json.loads(out)["ok"] is True
    stderr = "".join(err for _, _, err in done)
    assert stderr.count("building the sandbox environment") == 1, stderr[-3000:]
    assert stderr.count("waiting for another verdict building") >= 1, stderr[-3000:]
    kills = json.loads((pr_repo.cache / "mutants-cache.json").read_text())["kills"]
    assert set(kills) == {"rope.turns-backwards"}
    assert not [p.name for p in pr_repo.cache.iterdir() if p.name.startswith(".")]
