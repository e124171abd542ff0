"""The maintainers' spec kit: which stages load each of its files, and what those import.

``specs/_kit/`` holds spec-side helpers that several stages share, so that
none of them keeps a copy: ``speckit.py`` for acceptance tests and runtime
drivers (model and token builders, the float64 sampling filter, the
attention call recorder), ``speckit_sweeps.py`` for oracle drivers (torch
only: the oracle worker must look like a user's process) and
``speckit_module_sweeps.py``, a module's whole domain sweep, which loads it.
A file loads a kit file by path, naming its module; no test folder is on
``sys.path``.

A kit file is evidence of every stage whose spec-side files (anything under
``specs/<stage>/``) name it, its *users*. So:

- an amendment that changes a kit file must name each of its users, in the
  base or in the head, with a ``Spec:`` trailer, and the change is classified
  for each of them like an edit of their own tests (``checks.amendment``);
- a verdict writes the base's kit beside the base's acceptance tests
  (``verdict.plan``) and drivers (``verdict.files``);
- a user reaches the stages the kit files it names import (``checks.importers``).

A file names a kit file when its text holds the file's module name as a whole
word (``speckit`` names ``speckit.py``, ``speckit_sweeps`` names
``speckit_sweeps.py`` alone): maintainers write the load plainly, and these
files are maintainer-owned, never a stage PR's. Kit files are told apart per
file so that loading the oracle sweeps does not make a stage depend on every
stage the acceptance kit imports.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import PurePosixPath

from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.spec import KIT_DIR, SPECS_DIR


def in_kit(path: str) -> bool:
    """Whether a repository path is a file of the kit."""
    return path.startswith(f"{KIT_DIR}/")


def kit_files(files: Iterable[str]) -> list[str]:
    """The kit's Python files among ``files``, sorted."""
    return sorted(f for f in files if in_kit(f) and f.endswith(".py"))


def names(text: str, kit_file: str) -> bool:
    """Whether ``text`` names ``kit_file``: its module name as a whole word."""
    module = re.escape(PurePosixPath(kit_file).stem)
    return re.search(rf"(?<!\w){module}(?!\w)", text) is not None


def named_by(texts: Iterable[str], kit: Mapping[str, str | None]) -> list[str]:
    """The kit files (``kit``: path -> text) that ``texts`` name, and those they name in
    turn, transitively, sorted: what a driver loads reaches what that file loads."""
    reached: set[str] = set()
    frontier = list(texts)
    while frontier:
        new = {p for p in kit if p not in reached and any(names(t, p) for t in frontier)}
        reached |= new
        frontier = [kit[p] or "" for p in new]
    return sorted(reached)


def users(tree: Tree, stages: Iterable[str], kit_file: str) -> set[str]:
    """The stages among ``stages`` whose spec-side Python files in ``tree`` name ``kit_file``."""
    spec_side = [f for f in tree.files() if f.startswith(f"{SPECS_DIR}/") and f.endswith(".py")]
    return users_in(tree.read_many(spec_side), stages, kit_file)


def users_in(texts: Mapping[str, str | None], stages: Iterable[str], kit_file: str) -> set[str]:
    """``users`` from texts already read (path -> text); paths off the spec side are ignored.

    A kit file another kit file names (a table ``speckit.py`` reads, a helper
    it loads) is used by that file's users too, transitively, when ``texts``
    holds the kit's files: nothing in the kit escapes its users by being named
    only from inside the kit.
    """
    chain = {kit_file}
    grown = True
    while grown:
        named = {
            path
            for path, text in texts.items()
            if in_kit(path) and path not in chain and any(names(text or "", k) for k in chain)
        }
        chain |= named
        grown = bool(named)
    owned = {f"{SPECS_DIR}/{stage}/": stage for stage in stages}
    found: set[str] = set()
    for path, text in texts.items():
        stage = owned.get("/".join(path.split("/", 2)[:2]) + "/")
        if stage is not None and path.endswith(".py") and any(names(text or "", k) for k in chain):
            found.add(stage)
    return found
