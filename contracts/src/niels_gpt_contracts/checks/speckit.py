"""The maintainers' spec kit: which stages load it, and what it imports for them.

``specs/_kit/`` holds spec-side helpers that several stages' acceptance tests
share (model and token builders, the float64 sampling filter, the attention
call recorder), so that none of them keeps a copy. A file loads it by path,
naming the kit's module (``speckit.py``); no test folder is on ``sys.path``.

The kit is evidence of every stage whose spec-side files (anything under
``specs/<stage>/``) name it, its *users*. So:

- an amendment that changes a kit file must name each user, in the base or
  in the head, with a ``Spec:`` trailer, and the change is classified for
  each of them like an edit of their own tests (``checks.amendment``);
- a verdict writes the base's kit beside the base's acceptance tests
  (``verdict.plan``), as it writes a stage's own ``_kit.py``;
- a user's tests reach the stages the kit imports (``checks.importers``).

A file names the kit when its text holds ``KIT_NAME``: maintainers write the
load plainly, and these files are maintainer-owned, never a stage PR's.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.spec import KIT_DIR, KIT_NAME, SPECS_DIR


def in_kit(path: str) -> bool:
    """Whether a repository path is a file of the kit."""
    return path.startswith(f"{KIT_DIR}/")


def kit_files(files: Iterable[str]) -> list[str]:
    """The kit's Python files among ``files``, sorted."""
    return sorted(f for f in files if in_kit(f) and f.endswith(".py"))


def users(tree: Tree, stages: Iterable[str]) -> set[str]:
    """The stages among ``stages`` whose spec-side Python files in ``tree`` name the kit."""
    spec_side = [f for f in tree.files() if f.startswith(f"{SPECS_DIR}/") and f.endswith(".py")]
    return users_in(tree.read_many(spec_side), stages)


def users_in(texts: Mapping[str, str | None], stages: Iterable[str]) -> set[str]:
    """``users`` from texts already read (path -> text); paths off the spec side are ignored."""
    owned = {f"{SPECS_DIR}/{stage}/": stage for stage in stages}
    found: set[str] = set()
    for path, text in texts.items():
        stage = owned.get("/".join(path.split("/", 2)[:2]) + "/")
        if stage is not None and path.endswith(".py") and text is not None and KIT_NAME in text:
            found.add(stage)
    return found
