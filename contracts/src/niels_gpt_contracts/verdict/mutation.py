"""The mutant gate inside the PR verdict: every catalogued bug of the closure must die.

The catalogue comes from the base's specs; each mutant patches the head's
module (a PR that rewrites the patched lines makes the mutant stale, which
fails until a maintainer updates the spec); the killing tests are the
reference tests claiming the stage's invariants, run in the sandbox. A kill
proven before under the same proof key (``mutants.proof``: the head's stage
code in normal form, so an edit of docstrings or comments keeps it; the
reference tests; the base's conftest and pytest settings; the checker; the
sandbox interpreter's files) is reused from the cache. The hints (the test
that killed a mutant before, from the cache or the base's
``specs/mutant-hints.json``) order the runs and prove nothing by themselves.
Unless ``--full``, no run starts once a mutant survives.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from niels_gpt_contracts.checks.context import pr_context
from niels_gpt_contracts.checks.evidence import invariants
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.mutants import fates, hints, proof
from niels_gpt_contracts.mutants.launcher import TestEnv
from niels_gpt_contracts.mutants.runner import (
    Options,
    Work,
    execute,
    first_party,
    plan_stage,
    preload_modules,
    stage_tests,
)
from niels_gpt_contracts.mutants.store import Cache
from niels_gpt_contracts.result import BROKEN, KEPT, NOT_RUN, Outcome, Violation
from niels_gpt_contracts.sandbox import processes
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.pytest_run import PLUGINS
from niels_gpt_contracts.sandbox.workspace import src_roots
from niels_gpt_contracts.verdict import plan

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).

if TYPE_CHECKING:
    from niels_gpt_contracts.verdict.files import Workspace
    from niels_gpt_contracts.verdict.state import PrRequest

CACHE_NAME = "mutants-cache.json"


def _env(box: Sandbox, w: Workspace) -> TestEnv:
    roots = src_roots(w.head)

    def environ(overlay: Path | None) -> dict[str, str]:
        return box.environ([*([overlay] if overlay else []), *roots])

    return TestEnv(
        python=box.python,
        rootdir=w.ref,
        config=w.ref / "pyproject.toml",
        sources=w.head,
        environ=environ,
        plugins=tuple(a for p in PLUGINS for a in ("-p", p)),
        track=processes.tracked,
        scratch=box.tmp,
    )


def _texts(root: Path) -> dict[str, str]:
    """Every Python file written under ``root``, by its repository path."""
    return {
        p.relative_to(root).as_posix(): p.read_text(encoding="utf-8", errors="surrogateescape")
        for p in sorted(root.rglob("*.py"))
    }


def _error(stage: str, summary: str, message: str, path: str | None = None) -> Outcome:
    found = [Violation(fates.MUTANT_ERROR.id, path, None, message, stage, "mutants")]
    return Outcome(stage, "mutants", BROKEN, summary, found)


def run_mutants(
    ctx: pr_context.PrContext,
    p: plan.Plan,
    w: Workspace,
    box: Sandbox,
    request: PrRequest,
    cache: Cache,
    say: Callable[[str], None],
) -> Outcome:
    """The ``mutants`` row of the verdict.

    ``cache`` was read before any of the PR's code ran: kills the PR's code
    might have written into the cache file since are never believed.
    """
    stage = p.stage.id
    refs = set(p.reference_files)
    claims = invariants.scan_claims(ctx.base_tree, p.reference_from_base)
    claims += invariants.scan_claims(ctx.head_tree, p.reference_from_head)
    claims = [c for c in claims if c.path in refs]
    tests = {f: t for f, t in _texts(w.ref).items() if f in refs}
    config = [
        (w.ref / n).read_text(encoding="utf-8")
        for n in ("conftest.py", "pyproject.toml")
        if (w.ref / n).is_file()
    ]

    def read(path: str) -> str | None:
        return tests.get(path)

    plans = []
    for spec in p.closure:
        if not spec.mutants:
            continue
        try:
            plans.append(
                plan_stage(
                    spec,
                    ctx.base_tree.read(spec.path),
                    stage_tests(claims, spec.id),
                    read,
                    skip_retarget=True,
                )
            )
        except ConfigError as err:
            return _error(stage, "cannot plan", str(err), spec.path)
    # Marked by the base's amendment (a PR cannot mark one): this PR rewrites their code.
    pending = [f"{s.id}.{m['id']}" for s in p.closure for m in s.mutants if m.get("retarget")]
    if not any(x.mutants for x in plans):
        if pending:
            return Outcome(stage, "mutants", NOT_RUN, _pending(pending))
        return Outcome(stage, "mutants", KEPT, "no mutants catalogued for the closure")
    say(f"mutants: {sum(len(x.mutants) for x in plans)} of {', '.join(x.stage for x in plans)}")
    environment = proof.environment(box.site_paths())
    keys = proof.ProofKeys(_texts(w.head), tests, [*config, *proof.checker_files()], environment)
    ran = [tests[t] for x in plans for t in x.tests]
    preload = preload_modules([*config, *ran], first_party(ctx.head_tree.files()))
    committed = hints.parse(ctx.base_tree.read(hints.HINTS_PATH))
    opts = Options(repo=request.repo, jobs=request.jobs, progress=say, stop_early=not request.full)
    try:
        result = execute(Work(plans, keys, committed, preload), _env(box, w), cache, opts)
    except ConfigError as err:  # a clean run that fails: the reference rows say why
        return _error(stage, "clean run failed", str(err))
    found = [
        Violation(v.rule, v.path, v.line, v.message, stage, "mutants")
        for v in fates.violations(result)
    ]
    summary = fates.summary(result)
    if pending:
        summary += f"; {_pending(pending)}"
    status = BROKEN if found or not result.ok else NOT_RUN if pending else KEPT
    return Outcome(stage, "mutants", status, summary, found)


def _pending(names: list[str]) -> str:
    return (
        f"{len(names)} NOT RUN, marked for re-targeting by the base's amendment "
        f"(retarget = true): {', '.join(names)}"
    )
