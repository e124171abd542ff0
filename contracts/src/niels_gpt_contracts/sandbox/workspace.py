"""Trees written out to folders for sandboxed runs.

Files come from ``Tree`` objects (git blobs or the working tree), never from a
checkout the PR could have prepared. Symbolic links and binary files are not
written, and neither is any file that Python or pytest would load on its own
(``conftest.py``, ``sitecustomize.py``, ``*.pth``, ini files): the runs load
only what the checker puts there itself.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.self_loading import self_loading


def write(tree: Tree, paths: Iterable[str], dest: Path) -> list[str]:
    """Write the regular text files among ``paths`` under ``dest``; return those written."""
    wanted = [p for p in dict.fromkeys(paths) if not self_loading(p)]
    written: list[str] = []
    for path, text in tree.read_many(wanted).items():
        if text is None or tree.is_symlink(path):
            continue
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8", errors="surrogateescape")
        written.append(path)
    return written


def write_text(dest: Path, path: str, text: str) -> None:
    """Write one trusted file (a base conftest, a pytest config) under ``dest``."""
    target = dest / path
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text, encoding="utf-8", errors="surrogateescape")


def src_roots(dest: Path) -> list[Path]:
    """The ``packages/*/src`` folders written under ``dest``, sorted."""
    return sorted(p for p in dest.glob("packages/*/src") if p.is_dir())
