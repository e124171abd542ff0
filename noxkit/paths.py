"""Where things are, for noxfile.py and its helpers: the repository's folders and venvs."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONSTRAINTS = ROOT / "constraints.txt"
# Every stage package, found rather than listed: a new stage's PR may not edit
# this file (a meta path), yet its package must be installed and checked.
PACKAGES = sorted(p.parent for p in (ROOT / "packages").glob("*/pyproject.toml"))
CONTRACTS = ROOT / "contracts"
EXPERIMENTS = ROOT / "experiments"  # a user of the stage wheels, not a stage
SERVE = ROOT / "serve"  # the web app, another user of the stage wheels
DEV_ENV = ROOT / ".nox" / "_shared-dev"
REPORTS = ROOT / "reports"


def bin_dir(env: Path) -> Path:
    """The folder of a venv's executables."""
    return env / ("Scripts" if sys.platform == "win32" else "bin")
