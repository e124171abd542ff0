"""The verdict's guard: checker files, interpreter path and workspace must not change."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from prkit import PrRepo, rules_of

import niels_gpt_contracts
from niels_gpt_contracts.verdict.integrity import Guard, preload

MIXER = "packages/mixer/src/ngt/model/mixer.py"


def test_a_rewritten_checker_file_is_found(tmp_path: Path) -> None:
    package = tmp_path / "niels_gpt_contracts"
    shutil.copytree(Path(niels_gpt_contracts.__file__).parent, package)
    watched = tmp_path / "site"
    watched.mkdir()
    (watched / "keep.py").write_text("x = 1\n")
    guard = Guard.take([str(watched)], package)
    assert guard.changes() == []
    (package / "cli.py").write_text("def main(argv=None):\n    return 0\n")
    (watched / "evil.pth").write_text("import os\n")
    (watched / "keep.py").write_text("x = 2\n")
    assert guard.changes() == [
        str(package / "cli.py"),
        str(watched / "evil.pth"),
        str(watched / "keep.py"),
    ]


def test_a_linked_folder_planted_on_the_watched_path_is_found(tmp_path: Path) -> None:
    """A link is recorded, not followed: a new one is a change, its target's files are not."""
    watched, elsewhere = tmp_path / "site", tmp_path / "elsewhere"
    (watched / "pkg").mkdir(parents=True)
    (watched / "pkg" / "mod.py").write_text("x = 1\n")
    elsewhere.mkdir()
    (elsewhere / "evil.py").write_text("x = 2\n")
    guard = Guard.take([str(watched)], Path(niels_gpt_contracts.__file__).parent)
    (watched / "linked").symlink_to(elsewhere, target_is_directory=True)
    assert guard.changes() == [str(watched / "linked")]


def test_every_checker_module_is_imported_before_the_prs_code_runs() -> None:
    assert preload() >= 30


# What the dev environment has and the checker, installed alone, does not (numpy it
# has: the oracle compares tensors with it, a declared dependency).
NOT_DEPENDENCIES = ("pytest", "_pytest", "pluggy", "torch", "hypothesis", "xdist", "yaml")
BLOCK = f"""
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {NOT_DEPENDENCIES!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (not a dependency)")
        return None
sys.meta_path.insert(0, Block())
"""


def test_the_checker_runs_without_what_it_does_not_depend_on() -> None:
    """``preload`` (and the CLI) import only declared dependencies: on a runner the
    checker is installed alone, without pytest or torch (the workflow replay
    proves the same from a fresh venv)."""
    code = BLOCK + (
        "import niels_gpt_contracts.cli\n"
        "from niels_gpt_contracts.verdict.integrity import preload\n"
        "print(preload())\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) >= 30
    # and the block is real: the sandbox-only plugin needs pytest
    plugin = BLOCK + "import niels_gpt_contracts.pytest_plugin\n"
    done = subprocess.run([sys.executable, "-c", plugin], capture_output=True, text=True)
    assert "not a dependency" in done.stderr


def test_source_that_does_not_import_is_an_error_of_the_runs(pr_repo: PrRepo) -> None:
    pr_repo.replace(MIXER, "def mix(", "def mix(:\ndef mix(")
    pr_repo.pr("mixer")
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    assert {"tests.error", "api.missing"} <= rules_of(out)
