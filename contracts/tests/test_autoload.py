"""Self-loading files and tables, and symbolic links, in a stage PR."""

from __future__ import annotations

import pytest
from gatekit import Repo, rules

PR = ("--stage", "beta", "--base", "main", "--head", "HEAD", "--no-api")


@pytest.mark.parametrize(
    "path",
    [
        "packages/beta/tests/conftest.py",
        "packages/beta/src/sitecustomize.py",
        "packages/beta/usercustomize.py",
        "packages/beta/tests/pytest.ini",
        "packages/beta/tox.ini",
        "packages/beta/setup.cfg",
        "packages/beta/setup.py",
        "packages/beta/zz.pth",
    ],
)
def test_a_self_loading_file_is_named(repo: Repo, path: str) -> None:
    repo.write(path, "import os\n")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert ("path.autoload", path) in rules(out)


@pytest.mark.parametrize(
    "table",
    [
        '[project.entry-points.pytest11]\nevil = "ngx.beta_mod"\n',
        '[project.scripts]\nevil = "ngx.beta_mod:use"\n',
        '[tool.pytest.ini_options]\naddopts = "-p ngx.beta_mod"\n',
        '[tool.hatch.build.hooks.custom]\npath = "hook.py"\n',
        '[tool.hatch.build.targets.wheel.hooks.custom]\npath = "hook.py"\n',
        '[tool.hatch.build.targets.wheel.force-include]\n"x.py" = "ngx/alpha_mod.py"\n',
        '[build-system]\nrequires = ["evil-backend"]\nbuild-backend = "evil"\n',
    ],
)
def test_a_loading_table_in_pyproject_is_named(repo: Repo, table: str) -> None:
    path = "packages/beta/pyproject.toml"
    repo.write(path, repo.read(path) + "\n" + table)
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert rules(out) == {("path.autoload", path)}


def test_other_pyproject_edits_pass(repo: Repo) -> None:
    path = "packages/beta/pyproject.toml"
    repo.write(path, repo.read(path).replace('version = "0.1.0"', 'version = "0.2.0"'))
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 0, out["violations"]


def test_a_symlinked_module_is_named(repo: Repo) -> None:
    repo.symlink("packages/beta/src/ngx/beta_mod.py", "../../../alpha/src/ngx/alpha_mod.py")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert ("path.symlink", "packages/beta/src/ngx/beta_mod.py") in rules(out)


def test_an_empty_pr_is_an_error_not_a_pass(repo: Repo) -> None:
    code, out = repo.gate_json(*PR)
    assert code == 2
    assert "found no changed path" in out["error"]


def test_an_empty_pr_without_a_stage_says_there_are_no_commits(repo: Repo) -> None:
    code, out = repo.gate_json("--base", "main", "--head", "HEAD", "--no-api")
    assert code == 2
    assert "no commits between base and head" in out["error"] and ".." not in out["error"]


def test_the_root_conftest_is_a_meta_path(repo: Repo) -> None:
    repo.write("conftest.py", "import os\n")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert {("path.meta", "conftest.py"), ("path.autoload", "conftest.py")} <= rules(out)


def test_a_new_pyproject_like_the_base_stages_passes(repo: Repo) -> None:
    repo.write("packages/beta/tools/pyproject.toml", '[project]\nname = "x"\nversion = "1"\n')
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 0, out["violations"]


@pytest.mark.parametrize("name", ["Conftest.py", "SITECUSTOMIZE.PY", "x.PTH"])
def test_self_loading_names_are_matched_without_case(repo: Repo, name: str) -> None:
    path = f"packages/beta/tests/{name}"
    repo.write(path, "import os\n")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert ("path.autoload", path) in rules(out)
