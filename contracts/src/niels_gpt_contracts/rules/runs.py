"""The rule ids of what the verdict's runs decide: the tests on the PR's code,
each device's invariant report, the catalogued mutants, and the sandbox
guard that watched the runs.

``RUNS`` maps each id to its ``RuleDoc``; ``rules.RULES`` merges it with the
other families.
"""

from __future__ import annotations

from niels_gpt_contracts.rules.doc import RuleDoc

RUNS: dict[str, RuleDoc] = {
    "tests.failed": RuleDoc(
        "A test fails on the PR's code.",
        "The base's tests of the stage and of its dependants, the maintainers' acceptance "
        "tests and the PR's own tests all run over the PR's code; every one must pass.",
        "Run the named test on the PR's code and fix the failure.",
    ),
    "tests.skipped": RuleDoc(
        "A reference test skips on the PR's code.",
        "A reference test that runs on the base's code but skips on the PR's proves "
        "nothing there, so it counts as broken.",
        "Make the test run on the PR's code again (see why it skips).",
    ),
    "tests.missing": RuleDoc(
        "A reference test never runs on the PR's code.",
        "Each test the base collects must run on the PR's code; one that disappears "
        "(renamed, deselected, not collected) proves nothing.",
        "Restore the test, or keep it collectable under its name.",
    ),
    "tests.removed": RuleDoc(
        "A stage PR switches off a test of its stage.",
        "The next PR inherits this one's tests. A test the base collects and runs that the "
        "PR's version of the stage's tests deletes, renames, deselects, skips or marks as "
        "an expected failure no longer guards the stage; removing a test is a maintainer's "
        "amendment (a commit with Spec: trailers), not part of a stage PR.",
        "Restore the named test so that it runs and passes, or ask a maintainer to remove "
        "it in an amendment.",
    ),
    "tests.error": RuleDoc(
        "A test run of the verdict could not be read.",
        "A collection error, a time limit or a missing report leaves unknown what the run "
        "would have proved, so nothing in it counts as passed.",
        "Fix the error the message shows and run again.",
    ),
    "tests.weakened": RuleDoc(
        "The PR leaves its stage a weaker test suite than it found.",
        "The reference tests judge a PR with the base's versions of the tests it changed, "
        "so a loosened, skipped or deleted test hides nothing in this PR; but the next PR "
        "inherits this one's versions. The stage's catalogued mutants are run against the "
        "suite the PR leaves (its test files plus the acceptance tests): a mutant the "
        "base's suite kills and this one does not means a test lost its teeth.",
        "Restore the assertion, tolerance or case the change removed, or strengthen a "
        "test until it kills the mutant again.",
    ),
    "device.failed": RuleDoc(
        "A test proving an invariant failed on a device.",
        "The invariant report of a device's test session shows a failing test that "
        "claims the invariant.",
        "Run the named tests on that device (nox -s test-<device>) and fix the failure.",
    ),
    "device.incomplete": RuleDoc(
        "A device run ended in error before the invariant was verified.",
        "The device's test session ended with a non-zero pytest status and no passing "
        "test verified the invariant, so it cannot count as kept.",
        "Fix the error that stopped the run, then run the device session again.",
    ),
    "device.not-run": RuleDoc(
        "An invariant was not verified on a device the run requires.",
        "With --require-device, a device with no report, or whose tests for an invariant "
        "were all skipped, is broken rather than not run: a skip is not a pass.",
        "Run the stage's tests on the device, and make sure the invariant's tests do not "
        "skip there.",
    ),
    "device.stale": RuleDoc(
        "A device report was produced from another tree than the one judged.",
        "Every invariant report records the fingerprint of the stage sources and tests it "
        "ran on; a report whose fingerprint differs from the tree being judged proves "
        "nothing about it, so the device counts as not run (broken when required).",
        "Run the device session again on this tree: nox -s test-<device>.",
    ),
    "device.partial": RuleDoc(
        "A device report covers a narrowed test selection.",
        "A run narrowed with -k, -m, --deselect, node ids, -x or --last-failed (or an old "
        "report that does not say what it covered) may have left out a failing test, so "
        "it counts as not run (broken when required).",
        "Run the whole device session without narrowing options.",
    ),
    "mutant.survived": RuleDoc(
        "A catalogued bug was not caught by the stage's tests.",
        "Each stage's spec lists known bugs (mutants); the tests that claim the stage's "
        "invariants must fail on every one of them.",
        "Strengthen the tests (claiming the right invariant) until they fail on the "
        "mutant; never delete the mutant.",
    ),
    "mutant.stale": RuleDoc(
        "A catalogued bug no longer applies to the code.",
        "A mutant's find text must occur in its module exactly as often as it says; when "
        "the code moves on, the mutant tests nothing until it is rewritten.",
        "Rewrite the mutant's find/replace against the current source.",
    ),
    "mutant.error": RuleDoc(
        "A mutant run ended in error.",
        "A run that times out or crashes does not show the bug was caught, so it counts "
        "against the gate.",
        "Look at the reason in the message; fix the tests or the timeout.",
    ),
    "mutant.pending": RuleDoc(
        "A mutant is still marked for re-targeting.",
        "A maintainers' amendment may mark mutants whose code its stage PR rewrites "
        "(retarget = true): that PR's verdict reports them NOT RUN. Outside that verdict the "
        "mark means a known bug goes unchecked, so the mutant gate fails on it.",
        "Rewrite the mutant's find/replace at the new code (the same bug), prove it killed "
        "(nox -s mutants -- --stage S) and remove the mark, in a maintainers' commit.",
    ),
    "sandbox.tampered": RuleDoc(
        "A protected file changed while the PR's code ran.",
        "The checker, the sandbox interpreter and the verdict's workspace are hashed "
        "before the PR's code runs and checked after; a change means the PR's code "
        "reached what judges it, and the verdict cannot stand.",
        "Find what in the PR writes outside its own files, and remove it.",
    ),
}
