"""Per-stage report staleness: stage keys, merged reports, and the gate's rows.

The template repository has two stages, ``alpha`` and ``beta``, and beta's
package depends on alpha's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gatekit import Repo

from niels_gpt_contracts import fingerprint
from niels_gpt_contracts.device_report import merge, sections

ALPHA_MOD = "packages/alpha/src/ngx/alpha_mod.py"
BETA_MOD = "packages/beta/src/ngx/beta_mod.py"
SELF_CONTAINED = {
    "packages/alpha/tests/test_alpha.py": (
        "import pytest\n\n\n"
        '@pytest.mark.invariant("alpha.keeps_length")\ndef test_keeps_length():\n    pass\n\n\n'
        '@pytest.mark.invariant("alpha.turns_compose")\ndef test_turns_compose():\n    pass\n'
    ),
    "packages/beta/tests/test_beta.py": (
        'import pytest\n\n\n@pytest.mark.invariant("beta.uses_alpha")\ndef test_use():\n    pass\n'
    ),
}


# --- keys ------------------------------------------------------------------------


def test_an_edit_changes_its_stage_and_its_dependants_only(repo: Repo) -> None:
    before = fingerprint.stage_keys(repo.root)
    assert set(before) == {"alpha", "beta"}
    repo.replace(BETA_MOD, "def use(", "# a comment\ndef use(")
    leaf = fingerprint.stage_keys(repo.root)
    assert leaf["alpha"] == before["alpha"] and leaf["beta"] != before["beta"]
    repo.replace(ALPHA_MOD, "def rotate(", "# a comment\ndef rotate(")
    root = fingerprint.stage_keys(repo.root)
    assert root["alpha"] != leaf["alpha"] and root["beta"] != leaf["beta"]
    repo.write("conftest.py", "# shared by every stage's tests\n")
    shared = fingerprint.stage_keys(repo.root)
    assert all(shared[s] != root[s] for s in shared)


def test_a_stage_whose_tests_import_another_depends_on_it(repo: Repo) -> None:
    # alpha's package does not depend on beta, but a test of alpha runs beta's code
    # (as kv_cache's tests run the fast path); with beta -> alpha that is a cycle.
    before = fingerprint.stage_keys(repo.root)
    repo.replace(BETA_MOD, "def use(", "# a comment\ndef use(")
    assert fingerprint.stage_keys(repo.root)["alpha"] == before["alpha"]
    repo.write(
        "packages/alpha/tests/test_with_beta.py",
        'import importlib\n\nbeta = importlib.import_module("ngx.beta_mod")\n',
    )
    with_import = fingerprint.stage_keys(repo.root)
    repo.replace(BETA_MOD, "# a comment\n", "# another comment\n")
    after = fingerprint.stage_keys(repo.root)
    assert after["alpha"] != with_import["alpha"] and after["beta"] != with_import["beta"]
    repo.replace(ALPHA_MOD, "def rotate(", "# a comment\ndef rotate(")
    last = fingerprint.stage_keys(repo.root)
    assert last["alpha"] != after["alpha"] and last["beta"] != after["beta"]


def test_a_test_importing_a_package_depends_on_the_modules_behind_it(repo: Repo) -> None:
    """A stage whose code lives in named modules behind an ``__init__`` re-export
    (``from ngx.gamma import X``, X in ``ngx/gamma/impl.py``): a test importing the
    package depends on that stage, so an edit there makes the test's stage stale
    (quant's acceptance tests import the GPT, whose attention was edited)."""
    repo.write("packages/beta/src/ngx/gamma/__init__.py", "from ngx.gamma.impl import X\n")
    repo.write("packages/beta/src/ngx/gamma/impl.py", "X = 1\n")
    repo.write("specs/alpha/tests/test_uses_gamma.py", "from ngx.gamma import X\n")
    before = fingerprint.stage_keys(repo.root)
    repo.replace("packages/beta/src/ngx/gamma/impl.py", "X = 1", "X = 2")
    after = fingerprint.stage_keys(repo.root)
    assert after["beta"] != before["beta"]
    assert after["alpha"] != before["alpha"]  # alpha's package does not depend on beta


def test_the_real_quant_row_goes_stale_when_attention_changes(tmp_path: Path) -> None:
    root = Path(__file__).resolve().parents[2]
    copy = tmp_path / "tree"
    subprocess.run(["git", "clone", "-q", str(root), str(copy)], check=True)
    before = fingerprint.stage_keys(copy)
    causal = copy / "packages/attention/src/niels_gpt/model/attention/causal.py"
    causal.write_text(causal.read_text(encoding="utf-8") + "# a comment\n", encoding="utf-8")
    after = fingerprint.stage_keys(copy)
    assert after["quant"] != before["quant"]
    assert after["rope"] == before["rope"] and after["core"] == before["core"]


def test_an_acceptance_test_belongs_to_its_stage(repo: Repo) -> None:
    before = fingerprint.stage_keys(repo.root)
    repo.write("specs/alpha/tests/test_accept.py", "def test_a():\n    pass\n")
    after = fingerprint.stage_keys(repo.root)
    assert after["alpha"] != before["alpha"] and after["beta"] != before["beta"]
    assert fingerprint.owner("specs/alpha/tests/test_accept.py::test_a") == "alpha"
    assert fingerprint.owner("packages/beta/tests/test_beta.py::test_use") == "beta"
    assert fingerprint.owner("README.md::line 3") is None


def test_the_tree_hash_carries_the_keys(repo: Repo) -> None:
    tree = fingerprint.tree(repo.root)
    assert isinstance(tree, str) and tree.stages == fingerprint.stage_keys(repo.root)


# --- merging (pure) ----------------------------------------------------------------


KEYS = {"a": "k1", "b": "k2"}
A1, A2 = "packages/a/tests/t.py::one", "packages/a/tests/t.py::two"
B1 = "packages/b/tests/t.py::one"


def _run(tests: dict[str, str], collected: list[str], complete: set[str]) -> dict[str, Any]:
    """A run's report as the plugin builds it, before merging (every stage's key in KEYS)."""

    def entry(nodeid: str, outcome: str) -> dict[str, Any]:
        stage = str(fingerprint.owner(nodeid))
        return {"outcome": outcome, "invariants": [f"{stage}.x"], "key": KEYS[stage]}

    return {
        "device": "cpu",
        "exitstatus": 0,
        "format": 2,
        "sections": sections(collected, KEYS, complete, 0),
        "tests": {t: entry(t, o) for t, o in tests.items()},
    }


FULL = ({A1: "passed", A2: "passed", B1: "passed"}, [A1, A2, B1], {"a", "b"})


def test_a_narrowed_run_adds_to_the_report() -> None:
    full = merge(None, _run(*FULL))
    narrowed = merge(full, _run({B1: "failed"}, [A1, A2, B1], {"a", "b"}))
    assert set(narrowed["tests"]) == {A1, A2, B1} and narrowed["tests"][B1]["outcome"] == "failed"
    assert narrowed["invariants"]["a.x"]["passed"] == 2
    assert narrowed["invariants"]["b.x"] == {
        "passed": 0, "failed": 1, "skipped": 0, "tests": [B1], "failed_tests": [B1]
    }  # fmt: skip


def test_a_complete_section_drops_deleted_tests_and_a_partial_one_joins() -> None:
    full = merge(None, _run(*FULL))
    after_delete = merge(full, _run({A1: "passed"}, [A1, B1], {"a", "b"}))
    assert set(after_delete["tests"]) == {A1, B1}
    assert after_delete["sections"]["a"]["collected"] == [A1]
    part = merge(full, _run({A1: "passed"}, [A1], set()))  # given one file of a's
    assert part["sections"]["a"]["collected"] == [A1, A2] and part["sections"]["a"]["complete"]


def test_a_report_of_another_device_is_not_merged() -> None:
    other = {**_run({B1: "passed"}, [B1], {"b"}), "device": "mps"}
    alone = merge(other, _run({A1: "passed"}, [A1], {"a"}))
    assert set(alone["tests"]) == {A1} and set(alone["sections"]) == {"a"}


# --- the plugin writes it, the gate reads it -----------------------------------------


def _pytest(repo: Repo, report: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir",
         str(repo.root), f"--invariant-report={report}", *args],
        capture_output=True, text=True, check=False, cwd=repo.root,
    )  # fmt: skip


@pytest.fixture
def runnable(repo: Repo) -> Repo:
    """The template with tests that run without installing its packages."""
    for path, text in SELF_CONTAINED.items():
        repo.write(path, text)
    repo.commit("self-contained tests")
    return repo


def _rows(repo: Repo, reports: Path) -> dict[str, tuple[str, str]]:
    """``{"alpha:device:cpu": (status, summary or first violation)}`` with cpu required."""
    _, out = repo.gate_json("--no-api", "--reports", str(reports), "--require-device", "cpu")
    return {
        f"{o['stage']}:{o['check']}": (o["status"], o["summary"])
        for o in out["outcomes"]
        if o["check"] == "device:cpu"
    }


MERGE = "--invariant-report-merge"


@pytest.mark.parametrize("workers", [[], ["-p", "xdist", "-n", "2"]], ids=["one", "xdist"])
def test_an_edit_to_a_leaf_stage_leaves_the_others_fresh(
    runnable: Repo, tmp_path: Path, workers: list[str]
) -> None:
    report = tmp_path / "r" / "invariants-cpu.json"
    merging = ["--invariant-report-merge", *workers]
    done = _pytest(runnable, report, "packages", *merging)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(runnable, report.parent)
    assert rows["alpha:device:cpu"][0] == rows["beta:device:cpu"][0] == "KEPT"

    runnable.replace(BETA_MOD, "def use(", "# a comment\ndef use(")
    rows = _rows(runnable, report.parent)
    assert rows["alpha:device:cpu"][0] == "KEPT"
    status, why = rows["beta:device:cpu"]
    assert status == "BROKEN" and "tests of beta" in why and "ran on another tree" in why
    assert "nox -s test-cpu -- -k beta" in why

    done = _pytest(runnable, report, "packages", "-k", "beta", *merging)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = _rows(runnable, report.parent)
    assert rows["alpha:device:cpu"][0] == rows["beta:device:cpu"][0] == "KEPT"


def test_an_edit_to_a_root_stage_makes_its_dependants_stale(runnable: Repo, tmp_path: Path) -> None:
    report = tmp_path / "r" / "invariants-cpu.json"
    assert _pytest(runnable, report, "packages", "--invariant-report-merge").returncode == 0
    runnable.replace(ALPHA_MOD, "def rotate(", "# a comment\ndef rotate(")
    assert (
        _pytest(runnable, report, "packages", "-k", "alpha", "--invariant-report-merge").returncode
        == 0
    )
    rows = _rows(runnable, report.parent)
    assert rows["alpha:device:cpu"][0] == "KEPT"
    status, why = rows["beta:device:cpu"]
    assert status == "BROKEN" and "1 of beta's 1 tests have no outcome on this tree" in why


def test_without_merge_a_narrowed_run_replaces_the_report(runnable: Repo, tmp_path: Path) -> None:
    report = tmp_path / "r" / "invariants-cpu.json"
    assert _pytest(runnable, report, "packages", "--invariant-report-merge").returncode == 0
    assert _pytest(runnable, report, "packages", "-k", "alpha").returncode == 0
    rows = _rows(runnable, report.parent)
    assert rows["alpha:device:cpu"][0] == "KEPT"
    assert rows["beta:device:cpu"][0] == "BROKEN"
    assert "1 of beta's 1 tests have no outcome" in rows["beta:device:cpu"][1]


def test_a_run_given_part_of_a_stage_holds_it_only_in_part(runnable: Repo, tmp_path: Path) -> None:
    report = tmp_path / "r" / "invariants-cpu.json"
    runnable.write("packages/alpha/tests/test_more.py", "def test_more():\n    pass\n")
    one_file = "packages/alpha/tests/test_alpha.py"
    assert (
        _pytest(runnable, report, one_file, "packages/beta", "--invariant-report-merge").returncode
        == 0
    )
    rows = _rows(runnable, report.parent)
    assert rows["beta:device:cpu"][0] == "KEPT"
    status, why = rows["alpha:device:cpu"]
    assert status == "BROKEN" and "holds alpha's tests only in part" in why
    data = json.loads(report.read_text())
    assert data["format"] == 2 and data["sections"]["alpha"]["complete"] is False
