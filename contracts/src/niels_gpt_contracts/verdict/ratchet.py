"""The test ratchet: the base's tests decide, run over the PR's code.

Rules (rule ids ``tests.*``), per device:

- ``tests.failed``: a reference test (a base test of a closure stage, or an
  acceptance test) fails or errors on the PR's code; so does a PR test.
- ``tests.skipped``: a reference test skips on the PR's code but not on the
  base's code (checked by running exactly that test on the base). A skip the
  base shows too (an optional MPS test on a machine without MPS) stands; any
  other skip of a test the base runs is a test the PR switched off.
- ``tests.missing``: a reference test the base collects is not run at all on
  the PR's code (a parametrisation the PR's code emptied, say).
- ``tests.error``: a run could not be read (collection or usage error, time
  limit, no report): nothing it would have proved counts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.sandbox.pytest_run import PytestRun

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
TESTS_FAILED = Rule(
    "tests.failed",
    "A test fails on the PR's code.",
    "The base's tests of the stage and of its dependants, the maintainers' acceptance "
    "tests and the PR's own tests all run over the PR's code; every one must pass.",
    "Run the named test on the PR's code and fix the failure.",
)

TESTS_SKIPPED = Rule(
    "tests.skipped",
    "A reference test skips on the PR's code.",
    "A reference test that runs on the base's code but skips on the PR's proves "
    "nothing there, so it counts as broken.",
    "Make the test run on the PR's code again (see why it skips).",
)

TESTS_MISSING = Rule(
    "tests.missing",
    "A reference test never runs on the PR's code.",
    "Each test the base collects must run on the PR's code; one that disappears "
    "(renamed, deselected, not collected) proves nothing.",
    "Restore the test, or keep it collectable under its name.",
)

TESTS_ERROR = Rule(
    "tests.error",
    "A test run of the verdict could not be read.",
    "A collection error, a time limit or a missing report leaves unknown what the run "
    "would have proved, so nothing in it counts as passed.",
    "Fix the error the message shows and run again.",
)


@dataclass(frozen=True)
class Where:
    stage: str
    check: str


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def run_problem(run: PytestRun, at: Where, what: str) -> list[Violation]:
    """``tests.error`` when a run itself went wrong."""
    if run.problem is None:
        return []
    return [
        Violation(
            TESTS_ERROR.id,
            None,
            None,
            f"{what} on {run.device}: {run.problem}; last output:\n{run.tail()}",
            at.stage,
            at.check,
        )
    ]


def skipped(run: PytestRun) -> list[str]:
    return sorted(n for n, t in run.tests.items() if t.outcome == "skipped")


def judge_reference(
    run: PytestRun,
    at: Where,
    *,
    base_skips: Iterable[str],
    base_collected: Iterable[str] | None,
) -> list[Violation]:
    """Violations of the reference run.

    ``base_skips``: the skipped ids that skip on the base's code too;
    ``base_collected``: the ids the base's code collects (``None``: unknown).
    """
    out = run_problem(run, at, "the reference run (the base's tests over the PR's code)")
    also_on_base = set(base_skips)
    for nodeid, test in sorted(run.tests.items()):
        if test.outcome == "failed":
            out.append(
                Violation(
                    TESTS_FAILED.id,
                    _file(nodeid),
                    None,
                    f"{nodeid}: the base's test fails on the PR's code on {run.device}: "
                    f"{test.reason or '(no message)'}",
                    at.stage,
                    at.check,
                )
            )
        elif test.outcome == "skipped" and nodeid not in also_on_base:
            out.append(
                Violation(
                    TESTS_SKIPPED.id,
                    _file(nodeid),
                    None,
                    f"{nodeid}: skipped on the PR's code on {run.device} ({test.reason}), "
                    "but it runs on the base's code: a skip is not a pass",
                    at.stage,
                    at.check,
                )
            )
    if base_collected is not None and run.problem is None:
        for nodeid in sorted(set(base_collected) - set(run.tests)):
            out.append(
                Violation(
                    TESTS_MISSING.id,
                    _file(nodeid),
                    None,
                    f"{nodeid}: collected on the base's code, never run on the PR's code "
                    f"on {run.device}",
                    at.stage,
                    at.check,
                )
            )
    return out


def judge_pr_tests(run: PytestRun, at: Where) -> list[Violation]:
    """The PR's own added or changed tests must pass too."""
    out = run_problem(run, at, "the PR's own tests")
    for nodeid, test in sorted(run.tests.items()):
        if test.outcome == "failed":
            out.append(
                Violation(
                    TESTS_FAILED.id,
                    _file(nodeid),
                    None,
                    f"{nodeid}: the PR's own test fails on {run.device}: "
                    f"{test.reason or '(no message)'}",
                    at.stage,
                    at.check,
                    changed=True,
                )
            )
    return out
