"""What a PR verdict runs: which stages, which reference tests, which PR tests.

For a PR of stage ``S`` the *touched* stages are ``S`` and every stage whose
source files the PR changes (backbone v1 may edit core's ``config.py``); the
*closure* is the touched stages and every stage that depends on one of them
or uses one (its sources, tests or drivers import its modules: kv_cache's
tests and oracle run the fast path), transitively, read from the base. The *reference tests* are the
base's test files of every closure stage (``packages/<stage>/tests/**``) plus
their maintainer-owned acceptance tests (``specs/<stage>/tests/**``), each
taken from the base, except a file the PR edited under a line-scoped
permission (``V=`` added to ``ModelConfig(...)``) that the path check
accepted, which is taken from the head: that edit is proven harmless, and the
base version may no longer run against the PR's code. The *PR tests* are
the head's test files that the PR added or changed; they run too, apart from
the reference tests, and must pass.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from niels_gpt_contracts.gitdiff import Change
from niels_gpt_contracts.stagespec import Rule, Spec, compile_patterns

TEST_FILE = compile_patterns(["test_*.py", "*_test.py"])


@dataclass
class Plan:
    """The runs of one verdict."""

    stage: Spec
    closure: list[Spec]
    reference_from_base: list[str] = field(default_factory=list)
    reference_from_head: list[str] = field(default_factory=list)
    pr_support: list[str] = field(default_factory=list)  # head files the PR tests may import
    pr_tests: list[str] = field(default_factory=list)
    own_tests_touched: bool = False  # the PR changed, added or deleted a file of its tests/
    uses: dict[str, set[str]] = field(default_factory=dict)  # stage -> stages its files import

    @property
    def reference_files(self) -> list[str]:
        return sorted({*self.reference_from_base, *self.reference_from_head})

    @property
    def reference_targets(self) -> list[str]:
        """The reference test files pytest collects (not helpers)."""
        return [p for p in self.reference_files if is_test_file(p)]

    def rules(self) -> list[tuple[Spec, Rule]]:
        return [(s, r) for s in self.closure for r in s.rules if r.runtime]


def is_test_file(path: str) -> bool:
    return path.endswith(".py") and TEST_FILE.match_file(path.rsplit("/", 1)[-1])


def closure(
    touched: set[str], specs: Mapping[str, Spec], uses: Mapping[str, set[str]] | None = None
) -> list[Spec]:
    """The touched stages and every stage that depends on one or uses one, transitively,
    in spec order. ``uses``: stage -> the stages its files import (``checks.context.importers``)."""
    found = set(touched)
    edges = {s.id: set(s.depends_on) | set((uses or {}).get(s.id, ())) for s in specs.values()}
    changed = True
    while changed:
        changed = False
        for spec in specs.values():
            if spec.id not in found and found & edges[spec.id]:
                found.add(spec.id)
                changed = True
    return [s for s in specs.values() if s.id in found]


def _test_dirs(spec: Spec) -> tuple[str, str]:
    return f"{spec.package}/tests/", f"{spec.acceptance_dir}/"


def make_plan(
    stage: Spec,
    specs: Mapping[str, Spec],
    changes: list[Change],
    base_files: list[str],
    head_files: list[str],
    rejected: set[str],
    uses: Mapping[str, set[str]] | None = None,
) -> Plan:
    """Decide the runs from the base's specs, the diff and both trees' file lists.

    ``rejected``: paths the path check found violations on (never taken from the head);
    ``uses``: the base's import edges between stages (``checks.context.importers.uses``).
    """
    touched = {stage.id} | {
        s.id
        for s in specs.values()
        for c in changes
        for path in c.paths()
        if path.startswith(f"{s.src}/")
    }
    # A pending stage (spec and acceptance tests landed, package not yet) has
    # nothing to run against; its own first PR adds the package, so it counts.
    present = {f.split("/", 2)[1] for f in head_files if f.startswith("packages/")}
    stages = [
        s
        for s in closure(touched, specs, uses)
        if s.id == stage.id or s.package.removeprefix("packages/") in present
    ]
    plan = Plan(stage, stages, uses={k: set(v) for k, v in (uses or {}).items()})
    changed = {c.path for c in changes if c.status != "D"} - rejected
    scoped = [s.matcher for s in stage.line_scoped]
    for spec in stages:
        for path in base_files:
            if not path.startswith(_test_dirs(spec)) or not path.endswith(".py"):
                continue
            # Only a file the line-scoped permission judged (outside the stage's
            # may_change) is proven harmless; the stage's own tests match the
            # permission's patterns too, and are never taken from the head.
            line_edited = (
                path in changed
                and not stage.may_match.match_file(path)
                and not stage.must_not_match.match_file(path)
                and any(m.match_file(path) for m in scoped)
            )
            (plan.reference_from_head if line_edited else plan.reference_from_base).append(path)
    own = f"{stage.package}/tests/"
    plan.own_tests_touched = any(p.startswith(own) for c in changes for p in c.paths())
    plan.pr_support = sorted(p for p in head_files if p.startswith(own) and p.endswith(".py"))
    plan.pr_tests = sorted(
        p
        for p in changed
        if is_test_file(p)
        and "/tests/" in p
        and p.startswith("packages/")
        and p not in plan.reference_from_head
    )
    plan.pr_support = sorted({*plan.pr_support, *plan.pr_tests})
    return plan
