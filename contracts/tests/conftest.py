"""Fixtures for the checker's tests; the helpers live in ``gatekit``.

pytest runs with ``--import-mode=importlib``, so this directory is put on
``sys.path`` here for the test modules to import ``gatekit``.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gatekit import Repo, make_repo
from prkit import PrRepo, make_pr_repo
from realkit import RealRepo, add_stage, make_real_repo


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "hooks: runs pre-commit end to end (installs from the package index; nox -s test-hooks)",
    )
    config.addinivalue_line(
        "markers",
        "workflow: replays .github/workflows/contracts.yml (builds environments; "
        "nox -s test-workflow)",
    )
    config.addinivalue_line(
        "markers",
        "scenario: an attack or control judged by a whole `contracts pr` with torch in the "
        "sandbox, on the real stages or the toy monorepo's torch stages (up to minutes each; "
        "nox -s test-scenarios)",
    )
    config.addinivalue_line(
        "markers",
        "reseeded: a float64 reference against main at a seed drawn for the run "
        "(NIELS_REFERENCE_SEED reruns one; nox -s test-reseeded, .ci/run --full)",
    )
    config.addinivalue_line(
        "markers",
        "breadth: a float64 reference's wrong stages past the one every run keeps "
        "(refkit.wrong_cases; nox -s test-reseeded, .ci/run --full)",
    )
    config.addinivalue_line(
        "markers",
        "smoke: 5 scenarios in about 3 minutes (nox -s test-scenarios -- -m smoke): a "
        "first PR against the float64 reference, a foreign write, the environment seal "
        "both ways, and a loosened test judged with its stage's mutants; .ci/run --full "
        "runs every scenario",
    )


@pytest.fixture(scope="session")
def template_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_repo(tmp_path_factory.mktemp("template") / "repo").root


@pytest.fixture
def repo(template_repo: Path, tmp_path: Path) -> Repo:
    """A fresh copy of the template repository, on a PR branch ``pr``."""
    dest = tmp_path / "repo"
    shutil.copytree(template_repo, dest, symlinks=True)
    r = Repo(dest)
    r.branch("pr")
    return r


@pytest.fixture(scope="session")
def pr_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("pr-template") / "repo"
    make_pr_repo(root)
    return root


@pytest.fixture
def pr_repo(pr_template: Path, tmp_path: Path) -> PrRepo:
    """A fresh copy of the scenario monorepo, on a PR branch ``pr``."""
    dest = tmp_path / "repo"
    shutil.copytree(pr_template, dest, symlinks=True)
    r = PrRepo(dest, tmp_path / "cache")
    r.branch("pr")
    return r


@pytest.fixture(scope="session")
def real_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("real-template") / "repo"
    make_real_repo(root)
    return root


@pytest.fixture
def real_repo(real_template: Path, tmp_path: Path) -> RealRepo:
    """A fresh copy of the real-stage scenario repository, on a PR branch ``pr``."""
    dest = tmp_path / "repo"
    shutil.copytree(real_template, dest, symlinks=True)
    r = RealRepo(dest, tmp_path / "cache")
    r.branch("pr")
    return r


@pytest.fixture(scope="session")
def first_pr_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("first-pr-template") / "repo"
    make_real_repo(root, present=("core", "rope"))
    return root


@pytest.fixture
def first_pr_repo(first_pr_template: Path, tmp_path: Path) -> RealRepo:
    """Only core and rope built; attention's PR adds its package (the first PR)."""
    dest = tmp_path / "repo"
    shutil.copytree(first_pr_template, dest, symlinks=True)
    r = RealRepo(dest, tmp_path / "cache")
    r.branch("pr")
    add_stage(r, "attention")
    return r
