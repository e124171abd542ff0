"""The verdict's workspace: trees written out of git objects into folders.

``head`` holds the head's stage modules, ``base`` the base's (collection and
skip re-runs), ``ref`` the reference tests with the base's root
``conftest.py`` and pytest settings, ``pr`` the PR's own tests with the same
trusted configuration, ``drivers`` the base's runtime-rule drivers. ``ref`` and
``drivers`` both get the base's spec kit files the closure's specs declare
(``kit_files``). Only the modules the base's specs give the stages
are written (see ``write_workspace``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from niels_gpt_contracts.checks.context import pr_context, speckit
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.sandbox import workspace
from niels_gpt_contracts.stagespec import Spec
from niels_gpt_contracts.verdict import plan


@dataclass
class Workspace:
    root: Path
    head: Path  # the head's packages/*/src
    base: Path  # the base's packages/*/src (skip re-runs, collection)
    ref: Path  # reference tests + base conftest.py and pyproject.toml
    pr: Path  # the PR's own test files + the same trusted conftest and config
    drivers: Path  # the base's specs/<stage>/ runtime drivers

    def watched(self) -> list[str]:
        return [str(p) for p in (self.head, self.base, self.ref, self.pr, self.drivers)]


def write_workspace(ctx: pr_context.PrContext, p: plan.Plan, root: Path) -> Workspace:
    w = Workspace(root, root / "head", root / "base", root / "ref", root / "pr", root / "drivers")
    head_files, base_files = ctx.head_tree.files(), ctx.base_tree.files()
    # Only the modules the base's specs give each stage are written: a file at
    # another stage's path, an unlisted helper, a .pth or a planted .pyc never
    # reaches an interpreter (the modules check names them).
    owned = {f for s in ctx.specs.values() for f in s.module_files}
    workspace.write(ctx.head_tree, [f for f in head_files if f in owned], w.head)
    workspace.write(ctx.base_tree, [f for f in base_files if f in owned], w.base)
    kit = kit_files(ctx.base_tree, p.closure)
    workspace.write(ctx.base_tree, p.reference_from_base + kit, w.ref)
    workspace.write(ctx.head_tree, p.reference_from_head, w.ref)
    workspace.write(ctx.head_tree, p.pr_support, w.pr)
    workspace.write(ctx.base_tree, driver_files(ctx.base_tree, p.closure), w.drivers)
    for name in ("conftest.py", "pyproject.toml"):
        text = ctx.base_tree.read(name)
        for where in (w.ref, w.pr):
            if text is not None:
                workspace.write_text(where, name, text)
    if ctx.base_tree.read("pyproject.toml") is None:
        raise ConfigError("expected the base's root pyproject.toml (pytest settings), found none")
    return w


def kit_files(tree: Tree, specs: Iterable[Spec]) -> list[str]:
    """The spec kit files in ``tree`` that ``specs`` declare, or reach through the kit's
    own imports (``checks.context.speckit``)."""
    kit = speckit.kit_texts(tree.files(), tree.read_many)
    return speckit.files_used({m for s in specs for m in speckit.declared(s)}, kit)


def driver_files(tree: Tree, specs: Iterable[Spec]) -> list[str]:
    """The files in ``tree`` a driver of ``specs`` may import: each stage's
    ``specs/<stage>/`` files but its tests, and the kit files they declare."""
    own = [f for f in tree.files() for s in specs if f.startswith(f"specs/{s.id}/")]
    return sorted({f for f in own if "/tests/" not in f}) + kit_files(tree, specs)
