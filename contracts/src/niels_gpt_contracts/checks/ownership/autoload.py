"""Code that loads itself: files and tables a stage PR may not add or change.

pytest and Python run some files without anyone importing them: a
``conftest.py`` next to the tests, a ``sitecustomize.py``/``usercustomize.py``
or ``*.pth`` file on the path, an ini file that adds options or plugins, a
``pytest11`` entry point of an installed package, a build hook that runs at
install time. A stage PR could use any of them to make failing tests pass, so
(in the PR gate, on every changed path):

- ``path.autoload``: a changed file with one of those names or suffixes, or a
  changed ``pyproject.toml`` whose entry points, scripts, pytest section, build
  hooks or in-tree build backend differ from the base;
- ``path.symlink``: a changed path that is a symbolic link on the head: a
  symlinked module is another file's code under an allowed name.

The verdict's own test runs also never load such files (see ``verdict``), so
these rules name the attempt; they are not the only thing that stops it.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from typing import Any

import tomllib

from niels_gpt_contracts.gitdiff import Change, Tree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.self_loading import SELF_LOADING_NAMES, SELF_LOADING_SUFFIXES, file_name
from niels_gpt_contracts.stagespec import Spec

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
PATH_AUTOLOAD = Rule(
    "path.autoload",
    "A stage PR adds or changes code that loads without an import.",
    "Python and pytest run some files by their name or place alone: conftest.py, "
    "sitecustomize.py, usercustomize.py, *.pth, pytest and tox ini sections, entry "
    "points, build hooks. A stage PR must not bring any, or its code would run inside "
    "the checker's own test runs.",
    "Remove the file or table; put the code in a module that is imported explicitly.",
)

PATH_SYMLINK = Rule(
    "path.symlink",
    "A stage PR adds or changes a symbolic link.",
    "A link can make one path read another file than the one judged, so stages ship "
    "regular files only.",
    "Replace the link by a regular file.",
)

# pyproject tables that make code run on install, on import or inside pytest,
# or that decide what a wheel contains: the build backend and all of hatch's
# settings (build hooks, force-include of another stage's module path...).
LOADING_TABLES: tuple[tuple[str, ...], ...] = (
    ("project", "entry-points"),
    ("project", "scripts"),
    ("project", "gui-scripts"),
    ("tool", "pytest"),
    ("build-system",),
    ("tool", "hatch"),
)
STAGE_PYPROJECTS = "packages/*/pyproject.toml"


def _get(data: Mapping[str, Any], key: tuple[str, ...]) -> Any:
    node: Any = data
    for part in key:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _loading_parts(text: str) -> dict[str, Any]:
    data = tomllib.loads(text)
    return {".".join(key): _get(data, key) for key in LOADING_TABLES}


def _pyproject_problems(old: str | None, new: str | None, siblings: list[str]) -> list[str]:
    """Loading tables that differ from the base's version of the file.

    A new stage's ``pyproject.toml`` has no base version: each of its tables
    must then equal the same table of one of the base's stage packages (the
    build backend and hatch settings every stage uses, and no entry points).
    """
    if new is None:
        return []
    try:
        after = _loading_parts(new)
    except tomllib.TOMLDecodeError as err:
        return [f"cannot be parsed ({err}), so its loading tables cannot be vetted"]
    allowed: list[dict[str, Any]] = []
    for text in [old] if old is not None else siblings:
        try:
            allowed.append(_loading_parts(text))
        except tomllib.TOMLDecodeError:
            continue
    allowed = allowed or [dict.fromkeys(after)]  # no stage to compare with: none of them
    changed = sorted(k for k in after if all(a.get(k) != after[k] for a in allowed))
    return [
        f"changes [{key}]: entry points, scripts, pytest settings and build configuration "
        "(backend, hooks, what goes into the wheel) run or ship code nobody reviews in the "
        "stage's source; a stage PR keeps them as the base has them"
        for key in changed
    ]


def check_autoload(spec: Spec, changes: list[Change], base: Tree, head: Tree) -> list[Violation]:
    """``path.autoload`` and ``path.symlink`` for every changed path."""
    out: list[Violation] = []

    def add(rule: str, path: str, message: str) -> None:
        out.append(Violation(rule, path, None, message, spec.id, "autoload", changed=True))

    pyprojects: list[str] = []
    for change in changes:
        for path in change.paths():
            name = file_name(path)
            if name in SELF_LOADING_NAMES or name.endswith(SELF_LOADING_SUFFIXES):
                add(
                    PATH_AUTOLOAD.id,
                    path,
                    f"{name} is loaded by Python or pytest without being imported; "
                    "a stage PR may not add, change or remove one",
                )
            elif name == "pyproject.toml" and path == change.path:
                pyprojects.append(path)
            if path == change.path and head.is_symlink(path):
                add(
                    PATH_SYMLINK.id,
                    path,
                    "is a symbolic link: a stage PR ships regular files only "
                    "(a link would put another file's code under an allowed name)",
                )
    if pyprojects:
        before, after = base.read_many(pyprojects), head.read_many(pyprojects)
        stage_files = [
            f
            for f in base.files()
            if fnmatch.fnmatchcase(f, STAGE_PYPROJECTS) and f.count("/") == 2
        ]
        siblings = [t for t in base.read_many(stage_files).values() if t is not None]
        for path in pyprojects:
            for problem in _pyproject_problems(before.get(path), after.get(path), siblings):
                add(PATH_AUTOLOAD.id, path, problem)
    return out
