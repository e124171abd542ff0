"""The hooks through pre-commit itself, on a machine that never installed
the checker: pre-commit builds the hook environment from a local clone of
this repository (``pip install .`` at its root), and the hooks judge a
temporary project.

Marked ``hooks``: each test has pre-commit create a virtualenv and install
the checker and its dependencies from the package index, which takes tens
of seconds and needs the network, so ``nox -s test-hooks`` runs them and
``nox -s test-contracts`` leaves them out. The dependencies are pinned with
``constraints.txt`` (``PIP_CONSTRAINT``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from gatekit import Repo, make_repo

pytestmark = pytest.mark.hooks

ROOT = Path(__file__).resolve().parents[2]


def _run(cmd: list[str], cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)


@pytest.fixture(scope="module")
def hook_repo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A local clone of this repository as it is in the working tree
    (tracked and untracked files git does not ignore), one commit."""
    dest = tmp_path_factory.mktemp("hook-repo")
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.split(b"\0")
    for raw in filter(None, listed):
        source = ROOT / os.fsdecode(raw)
        if source.is_file() or source.is_symlink():
            target = dest / os.fsdecode(raw)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target, follow_symlinks=False)
    repo = Repo(dest)
    repo.git("init", "-q")
    repo.git("add", "-A")
    repo.git("-c", "user.name=t", "-c", "user.email=t@example.com", "commit", "-q", "-m", "hooks")
    return dest, repo.git("rev-parse", "HEAD")


@pytest.fixture
def clean_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a machine without the checker: no dev environment
    on PATH, pre-commit's cache in a fresh directory."""
    dev_bin = str(Path(sys.executable).parent)
    path = os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if p != dev_bin)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PRE_COMMIT", "VIRTUAL_ENV"))}
    env.update(
        PATH=path,
        PRE_COMMIT_HOME=str(tmp_path / "pre-commit-home"),
        PRE_COMMIT_COLOR="never",
        PIP_CONSTRAINT=str(ROOT / "constraints.txt"),
        GIT_AUTHOR_NAME="t",
        GIT_AUTHOR_EMAIL="t@example.com",
        GIT_COMMITTER_NAME="t",
        GIT_COMMITTER_EMAIL="t@example.com",
    )
    assert shutil.which("contracts", path=path) is None, "the checker is on PATH already"
    return env


@pytest.fixture
def project(tmp_path: Path, hook_repo: tuple[Path, str]) -> Repo:
    """A project using the hooks: main; ``good`` (an allowed alpha change) and
    ``bad`` (a root README edit), both with a ``Stage: alpha`` trailer."""
    repo = make_repo(tmp_path / "project")
    url, rev = hook_repo
    repo.write(
        ".pre-commit-config.yaml",
        f"repos:\n  - repo: {url}\n    rev: {rev}\n    hooks:\n"
        "      - id: contracts\n      - id: contracts-pr\n",
    )
    repo.commit("use the hooks")
    repo.git("checkout", "-q", "-b", "good")
    repo.write("packages/alpha/README.md", "alpha\n")
    repo.commit("alpha readme\n\nStage: alpha")
    repo.git("checkout", "-q", "-b", "bad", "main")
    repo.write("README.md", "# edited\n")
    repo.commit("edit the root readme\n\nStage: alpha")
    return repo


def _pre_commit(project: Repo, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, "-m", "pre_commit", *args], project.root, env)


def test_try_repo_blocks_a_bad_push_while_a_clean_branch_is_checked_out(
    project: Repo, hook_repo: tuple[Path, str], clean_env: dict[str, str]
) -> None:
    project.git("checkout", "-q", "good")
    done = _pre_commit(
        project,
        clean_env,
        "try-repo",
        str(hook_repo[0]),
        "contracts-pr",
        "--hook-stage",
        "pre-push",
        "--from-ref",
        "main",
        "--to-ref",
        "bad",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "README.md: path.not-allowed" in done.stdout


def test_installed_pre_push_hook_judges_the_pushed_refs(
    project: Repo, tmp_path: Path, clean_env: dict[str, str]
) -> None:
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", str(remote)], check=True)
    project.git("remote", "add", "origin", str(remote))
    installed = _pre_commit(project, clean_env, "install", "-t", "pre-push", "-t", "pre-commit")
    assert installed.returncode == 0, installed.stderr

    def push(branch: str) -> subprocess.CompletedProcess[str]:
        return _run(["git", "push", "-q", "origin", branch], project.root, clean_env)

    def pushed(branch: str) -> bool:
        heads = _run(["git", "ls-remote", "--heads", str(remote)], project.root, clean_env)
        return f"refs/heads/{branch}" in heads.stdout

    project.git("checkout", "-q", "main")
    first = push("main")  # a root commit: pre-commit gives no refs, the hook fails closed
    assert first.returncode != 0 and "PRE_COMMIT_FROM_REF" in first.stdout + first.stderr
    assert not pushed("main")
    forced = _run(["git", "push", "-q", "--no-verify", "origin", "main"], project.root, clean_env)
    assert forced.returncode == 0 and pushed("main")

    project.git("checkout", "-q", "bad")
    clean = push("good")
    assert clean.returncode == 0, clean.stdout + clean.stderr
    assert pushed("good")

    project.git("checkout", "-q", "good")
    bad = push("bad")
    assert bad.returncode != 0 and "README.md: path.not-allowed" in bad.stdout + bad.stderr
    assert not pushed("bad")

    tree = _pre_commit(project, clean_env, "run", "contracts")  # the pre-commit stage
    assert tree.returncode == 0, tree.stdout + tree.stderr
    assert "contracts (every stage's spec on the working tree)" in tree.stdout
