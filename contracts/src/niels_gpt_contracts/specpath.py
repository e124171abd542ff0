"""The import path of spec-side code under a tree ``root`` (see ``specs/_kit/speckit``).

The spec kit's package docstring gives the decision; these are its two
readings. A driver run (the oracle worker, the runtime-rule probe) gets the
kit's folder and the folder of each stage it drives; an acceptance-test run
(the pytest plugin, in the nox sessions and in a verdict's sandbox) gets the
kit's folder and every stage's ``tests`` folder. Imports nothing from the
checker: the pytest plugin uses it.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

KIT = Path("specs") / "_kit"


def driver_path(root: Path, stages: Iterable[str]) -> list[str]:
    """``root/specs/_kit`` and ``root/specs/<stage>`` for each of ``stages``, in order."""
    return [str(root / KIT), *(str(root / "specs" / s) for s in stages)]


def test_path(root: Path) -> list[str]:
    """``root/specs/_kit`` and every ``root/specs/<stage>/tests`` folder, sorted."""
    folders = sorted(p for p in root.glob("specs/*/tests") if p.is_dir())
    return [str(root / KIT), *map(str, folders)]
