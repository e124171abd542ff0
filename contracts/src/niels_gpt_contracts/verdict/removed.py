"""Removed tests (``tests.removed``): a stage PR may not switch off its stage's tests.

The reference run judges a PR with the base's versions of the tests, so a
test the PR deletes, skips or marks xfail hides nothing in the PR itself; but
the next PR inherits the head's versions. So when a stage PR touches its
stage's test folder (``packages/<stage>/tests/``: a test file, a helper or a
``conftest.py``, changed, added or deleted), the head's whole folder runs on
the head's code (the PR run), and every test of that folder that the base
collects and runs (collected on the base's code, and not a skip the base
shows too) must run there as well:

- missing from the PR run: deleted, renamed, or deselected;
- skipped there: a ``pytest.skip``, a ``skipif`` or a mark the PR added;
- an expected failure there (``xfail``, strict or not).

Each such test id is one ``tests.removed`` violation, BROKEN: removing a
test is a maintainer's amendment (a commit with ``Spec:`` trailers), never a
stage PR. A new test, or a test edited but still run, is not named here
(``tests.weakened`` measures what an edit loosened).
"""

from __future__ import annotations

from collections.abc import Iterable

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.sandbox.pytest_run import PytestRun
from niels_gpt_contracts.verdict import plan, ratchet

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
TESTS_REMOVED = Rule(
    "tests.removed",
    "A stage PR switches off a test of its stage.",
    "The next PR inherits this one's tests. A test the base collects and runs that the "
    "PR's version of the stage's tests deletes, renames, deselects, skips or marks as "
    "an expected failure no longer guards the stage; removing a test is a maintainer's "
    "amendment (a commit with Spec: trailers), not part of a stage PR.",
    "Restore the named test so that it runs and passes, or ask a maintainer to remove "
    "it in an amendment.",
)

RULE = TESTS_REMOVED.id
REASON_CHARS = 200


def own_folder(p: plan.Plan) -> str:
    """The stage's own test folder, ``packages/<stage>/tests/``."""
    return f"{p.stage.package}/tests/"


def head_targets(p: plan.Plan) -> list[str]:
    """What the PR run collects: the PR's changed tests, and, when the PR touched the
    stage's test folder, every test file of the head's folder."""
    if not p.own_tests_touched:
        return list(p.pr_tests)
    own = [f for f in p.pr_support if f.startswith(own_folder(p)) and plan.is_test_file(f)]
    return sorted({*p.pr_tests, *own})


def _how(head: PytestRun, nodeid: str) -> str | None:
    test = head.tests.get(nodeid)
    if test is None:
        return "no longer runs it (deleted, renamed or deselected)"
    if test.outcome != "skipped":
        return None  # passed, or failed (tests.failed names that)
    reason = test.reason[:REASON_CHARS]
    if reason.startswith("xfail"):
        return f"marks it as an expected failure ({reason})"
    return f"skips it ({reason or 'no reason given'})"


def judge(
    p: plan.Plan,
    base_collected: Iterable[str],
    base_skips: Iterable[str],
    head: PytestRun | None,
    at: ratchet.Where,
    device: str,
) -> list[Violation]:
    """``tests.removed`` for each of the stage's base tests the head's tests no longer run.

    ``base_collected``: the ids the base's tests collect on the base's code;
    ``base_skips``: ids that skip on the base's code as well (never demanded);
    ``head``: the PR run over ``head_targets`` (``None``: the head has no test file
    left in the folder, so nothing of it runs). A PR run that went wrong is left
    to ``tests.error``. Nothing is judged unless the PR touched the folder.
    """
    if not p.own_tests_touched or (head is not None and head.problem is not None):
        return []
    ran = head if head is not None else PytestRun("PR tests", device, 0, 0.0)
    skips = set(base_skips)
    out: list[Violation] = []
    for nodeid in sorted(set(base_collected)):
        if not nodeid.startswith(own_folder(p)) or nodeid in skips:
            continue
        how = _how(ran, nodeid)
        if how is None:
            continue
        out.append(
            Violation(
                RULE,
                nodeid.split("::", 1)[0],
                None,
                f"{nodeid}: the base collects and runs this test of the {p.stage.id} stage; "
                f"the PR's version of its tests {how} on {ran.device}: removing or switching "
                "off a stage's test is a maintainer's amendment, not a stage PR",
                at.stage,
                at.check,
                changed=True,
            )
        )
    return out
