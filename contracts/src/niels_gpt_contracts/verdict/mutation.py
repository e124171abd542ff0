"""The mutant gate inside the PR verdict: every catalogued bug of the closure must die.

The catalogue comes from the base's specs; each mutant patches the head's
module (a PR that rewrites the patched lines makes the mutant stale, which
fails until a maintainer updates the spec); the killing tests are the
reference tests claiming the stage's invariants, run in the sandbox. A kill
is cached under a key holding the mutant, every source file of the head, the
tests, the base's conftest and pytest settings and the checker's plugin, so
a kill the base already proved with the same code is not proved again.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from niels_gpt_contracts.checks import invariants, pr_context
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.mutants import report
from niels_gpt_contracts.mutants.launcher import TestEnv
from niels_gpt_contracts.mutants.runner import (
    Cache,
    Options,
    execute,
    first_party,
    plan_stage,
    plugin_source,
    preload_modules,
)
from niels_gpt_contracts.result import BROKEN, KEPT, Outcome, Violation
from niels_gpt_contracts.sandbox import processes
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.pytest_run import PLUGINS
from niels_gpt_contracts.sandbox.workspace import src_roots
from niels_gpt_contracts.verdict import plan

if TYPE_CHECKING:
    from niels_gpt_contracts.verdict.files import Workspace
    from niels_gpt_contracts.verdict.pr import PrRequest

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
    )


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
    head_src = sorted(
        f for f in ctx.head_tree.files() if "/src/" in f and f.startswith("packages/")
    )
    code = [f"{f}\n{ctx.head_tree.read(f) or ''}" for f in head_src]
    config = [
        (w.ref / n).read_text(encoding="utf-8")
        for n in ("conftest.py", "pyproject.toml")
        if (w.ref / n).is_file()
    ]

    def read(path: str) -> str | None:
        if path in refs:
            return (w.ref / path).read_text(encoding="utf-8")
        return ctx.head_tree.read(path)

    plans, keys, texts = [], {}, []
    for spec in p.closure:
        if not spec.mutants:
            continue
        tests = sorted(
            {c.path for c in claims if c.id and c.id.startswith(f"{spec.id}.") and c.path in refs}
        )
        try:
            one, k = plan_stage(
                spec,
                ctx.base_tree.read(spec.path),
                tests,
                read,
                (),
                [plugin_source(), *config, *code],
            )
        except ConfigError as err:
            return Outcome(
                stage,
                "mutants",
                BROKEN,
                "cannot plan",
                [Violation("mutant.error", spec.path, None, str(err), stage, "mutants")],
            )
        plans.append(one)
        keys.update(k)
        texts += [read(t) or "" for t in tests]
    if not plans:
        return Outcome(stage, "mutants", KEPT, "no mutants catalogued for the closure")
    say(f"mutants: {sum(len(x.mutants) for x in plans)} of {', '.join(x.stage for x in plans)}")
    opts = Options(repo=request.repo, jobs=request.jobs, progress=say)
    try:
        result = execute(
            plans,
            keys,
            preload_modules(texts, first_party(ctx.head_tree.files())),
            _env(box, w),
            cache,
            opts,
        )
    except ConfigError as err:  # a clean run that fails: the reference rows say why
        return Outcome(
            stage,
            "mutants",
            BROKEN,
            "clean run failed",
            [Violation("mutant.error", None, None, str(err), stage, "mutants")],
        )
    found = [
        Violation(v.rule, v.path, v.line, v.message, stage, "mutants")
        for v in report.violations(result)
    ]
    summary = report.summary(result)
    return Outcome(stage, "mutants", BROKEN if found else KEPT, summary, found)
