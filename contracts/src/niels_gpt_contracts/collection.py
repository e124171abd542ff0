"""What a pytest run collected, stage by stage, for the per-stage report.

``CollectionRecorder`` keeps every collected test id, the deselected ones
too (``-k``, ``-m``, ``--deselect`` narrow after collection); in an xdist
worker it hands them to the controller through ``workeroutput``.
``covered_stages`` says which stages' test folders the run's paths covered
whole, so that their lists of tests are complete.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

__all__ = ["COLLECTED", "CollectionRecorder", "covered_stages", "selection"]

COLLECTED = "niels_gpt_collected"


def covered_stages(config: pytest.Config, stages: dict[str, str]) -> set[str]:
    """The stages whose every test folder lies under a path the run was given.

    Node ids (``path::test``) cover nothing; ``--ignore`` makes no stage covered.
    """
    if config.getoption("ignore", None) or config.getoption("ignore_glob", None):
        return set()
    given = [
        Path(a) if os.path.isabs(a) else config.invocation_params.dir / a
        for a in config.args
        if "::" not in a
    ]
    given = [g.resolve() for g in given]
    root = config.rootpath
    covered = set()
    for stage in stages:
        folders = [root / "packages" / stage / "tests", root / "specs" / stage / "tests"]
        folders = [f.resolve() for f in folders if f.is_dir()]
        if folders and all(any(f == g or g in f.parents for g in given) for f in folders):
            covered.add(stage)
    return covered


class CollectionRecorder:
    """Every test id collected, the deselected ones too (``-k``, ``-m``, ``--deselect``).

    In an xdist worker it hands the list to the controller (``workeroutput``);
    the controller's ``InvariantReport`` records its own the same way.
    """

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.deselected: set[str] = set()
        self.collected: list[str] = []

    def pytest_deselected(self, items: list[pytest.Item]) -> None:
        self.deselected.update(item.nodeid for item in items)

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = sorted({item.nodeid for item in session.items} | self.deselected)
        output = getattr(self.config, "workeroutput", None)
        if output is not None:
            output[COLLECTED] = self.collected


def selection(config: pytest.Config) -> dict[str, object]:
    """The paths a run was given, and every option that narrowed it to fewer tests."""
    narrowed: list[str] = []
    for option, flag in (("keyword", "-k"), ("markexpr", "-m")):
        value = getattr(config.option, option, "")
        if value:
            narrowed.append(f"{flag} {value}")
    for option, flag in (("deselect", "--deselect"), ("invariant_prefix", "--invariant-prefix")):
        values = getattr(config.option, option, None) or []
        narrowed += [f"{flag} {v}" for v in values]
    for option, flag in (("lf", "--last-failed"), ("exitfirst", "-x"), ("collectonly", "--co")):
        if getattr(config.option, option, False):
            narrowed.append(flag)
    narrowed += [f"only {a}" for a in config.args if "::" in a]
    args = [os.path.relpath(a, config.rootpath) if os.path.isabs(a) else a for a in config.args]
    return {"args": args, "narrowed_by": narrowed}
