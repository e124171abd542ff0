"""What a test report was produced from: the tree it tested, and the selection.

``tree(root)`` hashes, in a fixed order, the path and bytes of every file that
decides a stage test run: ``packages/*/src/**``, ``packages/*/tests/**``, the
acceptance tests ``specs/*/tests/**``, the root ``conftest.py`` and the root
``pyproject.toml`` (pytest's settings). Caches (``__pycache__``, ``*.pyc``,
dot-folders) are left out. The pytest plugin writes it into every report; the
gate recomputes it, and a report from another tree is stale.

Imports nothing from the checker: the plugin and the gate both use it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

PATTERNS = ("packages/*/src", "packages/*/tests", "specs/*/tests")
ROOT_FILES = ("conftest.py", "pyproject.toml")


def _files(root: Path) -> Iterator[Path]:
    for pattern in PATTERNS:
        for folder in sorted(root.glob(pattern)):
            for path in sorted(folder.rglob("*")):
                rel = path.relative_to(root).parts
                if any(p.startswith(".") or p == "__pycache__" for p in rel):
                    continue
                if path.is_file() and path.suffix != ".pyc":
                    yield path
    for name in ROOT_FILES:
        if (root / name).is_file():
            yield root / name


def tree(root: Path) -> str:
    """The hex SHA-256 of every file that decides a stage test run under ``root``."""
    digest = hashlib.sha256()
    for path in _files(root):
        digest.update(path.relative_to(root).as_posix().encode("utf-8", "surrogateescape"))
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()
