"""The checker proves to itself that the PR's code did not rewrite it.

Before any of the PR's code runs, every module of the checker is imported
(so later reads of its files cannot change what runs) and every file of its
package is hashed. After the runs the hashes are taken again; so are
snapshots of the sandbox interpreter's import path and of the workspace
folders the runs read. Any difference means the PR's code wrote outside its
sandbox, and the verdict is BROKEN (``sandbox.tampered``), whatever the tests
said.
"""

from __future__ import annotations

import importlib
import pkgutil
from dataclasses import dataclass
from pathlib import Path

import niels_gpt_contracts
from niels_gpt_contracts.digests import tree_digests
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.sandbox.environment import Snapshot

SANDBOX_TAMPERED = Rule(
    "sandbox.tampered",
    "A protected file changed while the PR's code ran.",
    "The checker, the sandbox interpreter and the verdict's workspace are hashed "
    "before the PR's code runs and checked after; a change means the PR's code "
    "reached what judges it, and the verdict cannot stand.",
    "Find what in the PR writes outside its own files, and remove it.",
)

# Modules that run only inside the sandbox (scripts, and the pytest plugin that
# the sandbox's pytest loads from the bootstrap copy), never in the checker:
# they import what the checker does not depend on (pytest, torch). The guard
# still hashes their files.
SANDBOX_ONLY = (
    "_api_probe",
    "_name_probe",
    "_runtime_probe",
    "_bootstrap_site",
    "zygote",
    "_oracle_kit",
    "driverkit",  # the drivers' typing face of _oracle_kit (torch)
    "_oracle_worker",
    "_oracle_aftermath",  # the worker's measurements (torch)
    "_oracle_capture",  # a reproducer's capture run (torch)
    "_protocol_worker",  # the module protocol's worker (torch)
    "_protocol_probes",  # its measurements (torch)
    "_protocol_state",  # the torch globals it compares (torch)
    "_repro_script",  # never imported: its text is written beside a reproducer's data
    "pytest_plugin",
    "collection",  # the pytest plugin's helper
    "ops_plugin",  # records the ops of tests = true runtime rules in the sandbox's pytest
)


def preload() -> int:
    """Import every module the checker itself runs now (not ``SANDBOX_ONLY``); how many.

    Only the checker's declared dependencies are imported here: the checker
    installed alone (``pip install ./contracts``, no pytest or torch) must run.
    """
    count = 0
    for info in pkgutil.walk_packages(
        niels_gpt_contracts.__path__, prefix=f"{niels_gpt_contracts.__name__}."
    ):
        if info.name.rsplit(".", 1)[-1] in SANDBOX_ONLY:
            continue
        importlib.import_module(info.name)
        count += 1
    return count


def _hashes(root: Path) -> dict[str, str]:
    # __pycache__ included: a planted bytecode file would run instead of the source.
    return tree_digests(root)


@dataclass
class Guard:
    """Hashes of the checker package and snapshots of what the runs must not change."""

    package: Path
    checker: dict[str, str]
    watched: Snapshot
    roots: tuple[str, ...]

    @classmethod
    def take(cls, watched: list[str], package: Path | None = None) -> Guard:
        """Hash ``package`` (default: the running checker's) and snapshot ``watched``."""
        package = package or Path(niels_gpt_contracts.__file__).resolve().parent
        return cls(package, _hashes(package), Snapshot.take(watched), tuple(watched))

    def changes(self) -> list[str]:
        """What changed since ``take``: checker files first, then watched files."""
        now = _hashes(self.package)
        checker = sorted(
            str(self.package / k)
            for k in {*now, *self.checker}
            if now.get(k) != self.checker.get(k)
        )
        return checker + self.watched.changes(Snapshot.take(self.roots))
