"""Which stages use which: the edges a PR's closure follows, read from imports.

A spec's ``depends_on`` says what a stage's package needs to install. What a
change can break is wider: kv_cache's and padding's tests, oracle drivers and
runtime drivers import the fast path, though neither package depends on it.
So a stage ``X`` *uses* a stage ``S`` when any file of ``X`` imports a module
``S`` owns: its sources (``packages/X/src``), its package tests
(``packages/X/tests``), and everything of its beside the spec
(``specs/X/``: acceptance tests, oracle, runtime and reference drivers),
and each spec kit file that ``X``'s spec declares (``speckit``).

Imports are read with ``ast`` from the tree given (the base's, for a verdict):
``import a.b``, ``from a import b`` (``a.b`` when ``b`` is a module), at any
depth, lazy ones inside functions included. Strings naming modules
(``importlib.import_module("...")``) are not followed: stage code may not build
names (``source.dynamic``) and maintainer drivers import plainly. A file that
does not parse adds no edge (the static checks judge it).
"""

from __future__ import annotations

from collections.abc import Mapping

from niels_gpt_contracts.checks.context import speckit
from niels_gpt_contracts.fingerprint import imported_names
from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.stagespec import Spec, import_name


def _stage_of(path: str, specs: Mapping[str, Spec]) -> str | None:
    """The stage a repository path belongs to, or ``None``."""
    for spec in specs.values():
        if path.startswith((f"{spec.package}/", f"specs/{spec.id}/")):
            return spec.id
    return None


def uses(specs: Mapping[str, Spec], tree: Tree) -> dict[str, set[str]]:
    """Stage -> the other stages whose modules its files import, in ``tree``."""
    owner = {import_name(m): s.id for s in specs.values() for m in s.modules}
    files = [f for f in tree.files() if f.endswith(".py")]
    by_stage = {f: stage for f in files if (stage := _stage_of(f, specs)) is not None}
    edges: dict[str, set[str]] = {}
    texts = tree.read_many(by_stage)
    for path, text in texts.items():
        if text is None:
            continue
        stage = by_stage[path]
        used = {owner[n] for n in imported_names(text) if n in owner} - {stage}
        edges.setdefault(stage, set()).update(used)
    kit = speckit.kit_texts(files, tree.read_many)
    declarations = {s.id: speckit.declared(s) for s in specs.values()}
    for kit_file, text in kit.items():
        reached = {owner[n] for n in imported_names(text or "") if n in owner}
        for stage in speckit.users(declarations, kit_file, kit):  # what a kit file imports,
            edges.setdefault(stage, set()).update(reached - {stage})  # its users use
    return edges
