"""An import probe that times out is a verdict only where the base's answered in time.

On a loaded machine an honest PR's import can outrun the probe's limit; the
base's code is then probed too. Only the PR slower than its base is BROKEN
(``api.probe``); both too slow is no verdict (exit 2), never a BROKEN the
PR did not earn.
"""

from __future__ import annotations

import pytest
from gatekit import Repo, rules

from niels_gpt_contracts.checks.public_api import api

PR = ("--stage", "beta", "--base", "main", "--head", "HEAD")
BETA = "packages/beta/src/ngx/beta_mod.py"
SLOW = "import time\n\ntime.sleep(6)\n"


@pytest.fixture(autouse=True)
def _short_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(api, "TIMEOUT_S", 3)


def test_a_pr_slower_than_its_base_is_broken(repo: Repo) -> None:
    repo.replace(BETA, "__all__", SLOW + "__all__")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert "api.probe" in {rule for rule, _ in rules(out)}
    words = [v["message"] for v in out["violations"] if v["rule"] == "api.probe"]
    assert any("where the base's code answered in time" in w for w in words), words


def test_a_base_as_slow_as_the_pr_is_no_verdict(repo: Repo) -> None:
    repo.git("checkout", "-q", "main")
    repo.replace(BETA, "__all__", SLOW + "__all__")
    repo.commit("slow import on main")
    repo.git("checkout", "-q", "pr")
    repo.git("merge", "-q", "main")
    repo.replace(BETA, "def use(", "# a comment\ndef use(")
    repo.commit()
    code, out, err = repo.gate(*PR)
    assert code == 2, out
    assert "could not judge: the import probe timed out" in err, err
