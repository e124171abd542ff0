"""Weakened tests say so (``tests.weakened``): the next PR must not inherit a weaker suite.

The reference tests judge a PR with the base's versions of the tests it
changed, so loosening, skipping or deleting a test never hides a bug in the
PR itself. But a merged PR hands its own versions to the next one. So when a
stage PR changes or deletes test files of its stage, the stage's catalogued
mutants run once more against the suite the PR would leave behind: the
head's test files of the stage (the changed ones, the untouched ones and the
added ones) plus the maintainers' acceptance tests. A mutant that the base's
suite kills (the ``mutants`` row) and this suite lets survive is named, with
the changed or deleted files: that change weakened the suite, even if the
PR's code is right.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from niels_gpt_contracts.checks.context import pr_context
from niels_gpt_contracts.checks.evidence import invariants
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.mutants import proof
from niels_gpt_contracts.mutants.launcher import TestEnv
from niels_gpt_contracts.mutants.runner import (
    Cache,
    Options,
    Work,
    execute,
    first_party,
    plan_stage,
    preload_modules,
)
from niels_gpt_contracts.result import BROKEN, KEPT, NOT_RUN, Outcome, Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.sandbox import processes, workspace
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.pytest_run import PLUGINS
from niels_gpt_contracts.verdict import plan

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
TESTS_WEAKENED = Rule(
    "tests.weakened",
    "The PR leaves its stage a weaker test suite than it found.",
    "The reference tests judge a PR with the base's versions of the tests it changed, "
    "so a loosened, skipped or deleted test hides nothing in this PR; but the next PR "
    "inherits this one's versions. The stage's catalogued mutants are run against the "
    "suite the PR leaves (its test files plus the acceptance tests): a mutant the "
    "base's suite kills and this one does not means a test lost its teeth.",
    "Restore the assertion, tolerance or case the change removed, or strengthen a "
    "test until it kills the mutant again.",
)

CHECK = "weakened"


def weakened_files(ctx: pr_context.PrContext, p: plan.Plan) -> list[str]:
    """The stage's test files (``packages/<stage>/tests/**.py``) the PR changed or deleted."""
    own = f"{p.stage.package}/tests/"
    out: set[str] = set()
    for change in ctx.changes:
        if change.status == "A":
            continue
        for path in change.paths():
            if (
                path.startswith(own)
                and path.endswith(".py")
                and (change.status != "R" or path == change.old_path)
            ):
                out.add(path)
    return sorted(out)


def judge(
    ctx: pr_context.PrContext,
    p: plan.Plan,
    box: Sandbox,
    root: Path,
    cache: Cache,
    mutants_row: Outcome,
    jobs: int,
    say: Callable[[str], None],
) -> Outcome:
    """The ``weakened`` row; ``mutants_row`` is the base suite's verdict on the same mutants."""
    stage, spec = p.stage.id, p.stage
    changed = weakened_files(ctx, p)
    if not changed:
        return Outcome(stage, CHECK, KEPT, "no test file of the stage changed or deleted")
    if not spec.mutants:
        why = f"{len(changed)} test file(s) changed; no mutants catalogued to measure them"
        return Outcome(stage, CHECK, NOT_RUN, why)
    head_tests = [f for f in ctx.head_tree.files() if f.startswith(f"{spec.package}/tests/")]
    accept = [f for f in ctx.base_tree.files() if f.startswith(f"{spec.acceptance_dir}/")]
    weak = root / "weak"
    workspace.write(ctx.head_tree, head_tests, weak)
    workspace.write(ctx.base_tree, accept, weak)
    config = []
    for name in ("conftest.py", "pyproject.toml"):
        text = ctx.base_tree.read(name)
        if text is not None:
            workspace.write_text(weak, name, text)
            config.append(text)
    claims = invariants.scan_claims(ctx.head_tree, head_tests)
    claims += invariants.scan_claims(ctx.base_tree, accept)
    tests = sorted({c.path for c in claims if c.id and c.id.startswith(f"{stage}.")})
    head = root / "head"
    code = {
        f.relative_to(head).as_posix(): f.read_text("utf-8", "surrogateescape")
        for f in sorted(head.rglob("*.py"))
    }

    def read(path: str) -> str | None:
        target = weak / path
        return target.read_text(encoding="utf-8") if target.is_file() else ctx.head_tree.read(path)

    base_survivors = {v.message.split(":", 1)[0] for v in mutants_row.violations}
    say(f"weakened tests: {len(changed)} changed file(s); {len(spec.mutants)} mutants of {stage}")
    try:
        one = plan_stage(spec, ctx.base_tree.read(spec.path), tests, read, skip_retarget=True)
        texts = {t: read(t) or "" for t in tests}
        checker = [*config, *proof.checker_files()]
        keys = proof.ProofKeys(code, texts, checker, proof.environment(box.site_paths()))
        env = TestEnv(
            python=box.python,
            rootdir=weak,
            config=weak / "pyproject.toml",
            sources=head,
            environ=lambda overlay: box.environ(
                [*([overlay] if overlay else []), *workspace.src_roots(head)]
            ),
            plugins=tuple(a for plugin in PLUGINS for a in ("-p", plugin)),
            track=processes.tracked,
            scratch=box.tmp,
        )
        preload = preload_modules(list(texts.values()), first_party(ctx.head_tree.files()))
        opts = Options(repo=ctx.repo.root, jobs=jobs, progress=say)
        result = execute(Work([one], keys, {}, preload), env, cache, opts)
    except ConfigError as err:
        found = [Violation(TESTS_WEAKENED.id, changed[0], None, str(err), stage, CHECK)]
        return Outcome(stage, CHECK, BROKEN, "the PR's suite does not run clean", found)
    files = ", ".join(changed)
    found = [
        Violation(
            TESTS_WEAKENED.id,
            changed[0],
            None,
            f"{v.mutant.name}: the base's tests kill it, the suite this PR leaves ({files} "
            f"changed or deleted) does not ({v.status}): {v.mutant.text}",
            stage,
            CHECK,
        )
        for v in result.fates
        if v.status != "killed" and v.mutant.name not in base_survivors
    ]
    if found:
        return Outcome(stage, CHECK, BROKEN, f"{len(found)} mutant(s) no longer killed", found)
    summary = f"{len(changed)} changed test file(s); the suite still kills {result.killed} mutants"
    return Outcome(stage, CHECK, KEPT, summary)
