"""The pre-commit hooks, fast: ``--pre-push`` judges the refs being pushed,
the hook manifest, and the root ``[project]`` that pre-commit installs.

The same hooks run through pre-commit itself in ``test_hooks_e2e.py``
(``nox -s test-hooks``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import tomllib
import yaml
from gatekit import Repo

ROOT = Path(__file__).resolve().parents[2]
REFS = ("PRE_COMMIT_FROM_REF", "PRE_COMMIT_TO_REF")


def _toml(path: Path) -> dict[str, Any]:
    with path.open("rb") as f:
        return tomllib.load(f)


@pytest.fixture
def branches(repo: Repo) -> dict[str, str]:
    """main; ``good`` (an allowed alpha change); ``bad`` (a root README edit)."""
    shas = {"main": repo.git("rev-parse", "main")}
    repo.git("checkout", "-q", "-b", "good", "main")
    repo.write("packages/alpha/README.md", "alpha\n")
    shas["good"] = repo.commit("alpha readme\n\nStage: alpha")
    repo.git("checkout", "-q", "-b", "bad", "main")
    repo.write("README.md", "# edited\n")
    shas["bad"] = repo.commit("edit the root readme\n\nStage: alpha")
    return shas


def _push(repo: Repo, monkeypatch: pytest.MonkeyPatch, sha: str, base: str) -> tuple[int, str]:
    monkeypatch.setenv("PRE_COMMIT_FROM_REF", base)
    monkeypatch.setenv("PRE_COMMIT_TO_REF", sha)
    code, out, _ = repo.gate("--pre-push", "--no-api")
    return code, out


def test_pushing_a_clean_branch_passes_while_a_bad_one_is_checked_out(
    repo: Repo, branches: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo.git("checkout", "-q", "bad")
    repo.write("packages/beta/src/ngx/beta_mod.py", "broken = (\n")  # and the tree is dirty
    code, out = _push(repo, monkeypatch, branches["good"], branches["main"])
    assert code == 0, out
    assert f"to {branches['good'][:12]}" in out


def test_pushing_a_bad_branch_fails_while_a_clean_one_is_checked_out(
    repo: Repo, branches: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    repo.git("checkout", "-q", "good")
    code, out = _push(repo, monkeypatch, branches["bad"], branches["main"])
    assert code == 1
    assert "README.md: path.not-allowed" in out


@pytest.mark.parametrize("unset", [REFS[0], REFS[1], "both"])
@pytest.mark.parametrize("empty", [False, True])
def test_pre_push_without_refs_fails_closed(
    repo: Repo, monkeypatch: pytest.MonkeyPatch, unset: str, empty: bool
) -> None:
    for name in REFS:
        monkeypatch.setenv(name, "HEAD")
        if unset in (name, "both"):
            if empty:
                monkeypatch.setenv(name, " ")
            else:
                monkeypatch.delenv(name)
    code, out, err = repo.gate("--pre-push", "--no-api")
    assert (code, out) == (2, "")
    assert err.startswith("contracts: error: --pre-push: expected PRE_COMMIT_FROM_REF")
    assert err.count("\n") == 1


def test_pre_push_refuses_explicit_refs_beside_it(
    repo: Repo, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in REFS:
        monkeypatch.setenv(name, "HEAD")
    code, _, err = repo.gate("--pre-push", "--base", "main", "--no-api", "--format", "json")
    assert code == 2 and "expected no --base/--head beside it" in err


def test_the_hooks_install_themselves_and_judge_refs() -> None:
    hooks = {h["id"]: h for h in yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())}
    assert set(hooks) == {"contracts", "contracts-pr"}
    for hook in hooks.values():
        assert hook["language"] == "python"  # pre-commit builds it: no manual install
        assert hook["pass_filenames"] is False and hook["always_run"] is True
        assert hook["entry"].split()[:2] == ["contracts", "check"]
    assert "--pre-push" in hooks["contracts-pr"]["entry"].split()
    assert "pre-push" in hooks["contracts-pr"]["stages"]
    assert "pre-push" not in hooks["contracts"]["stages"]  # it judges the working tree


def test_root_project_is_the_checker_as_contracts_packages_it() -> None:
    """pre-commit runs ``pip install .`` at the root: what it installs must be
    the checker with exactly the dependencies ``contracts/`` declares."""
    root, own = _toml(ROOT / "pyproject.toml"), _toml(ROOT / "contracts" / "pyproject.toml")
    for key in ("name", "version", "requires-python", "dependencies", "scripts"):
        assert root["project"][key] == own["project"][key], key
    assert root["build-system"] == own["build-system"]
    (package,) = root["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    (own_package,) = own["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"]
    assert ROOT / package == ROOT / "contracts" / own_package
    assert (ROOT / package / "cli.py").is_file()
    assert (ROOT / root["project"]["readme"]).is_file()
