"""Runtime rules over the reference tests (``runtime.<rule>`` in ``tests:<device>``).

A ``forbidden_ops`` rule with ``tests = true`` also holds while the stage's
reference tests run (its own tests and its acceptance tests): ``ops_plugin``
records the ops matching the rule's patterns during each such test's call
on the PR's code. Tests import whatever they like to compute what they
expect (a fused kernel as a reference, say), so an op counts only where the
same test on the base's code did not dispatch it: the tests with a hit run
again on the base's code, recording too, and what only the PR's code
dispatched breaks the rule.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.sandbox.pytest_run import PytestRun
from niels_gpt_contracts.stagespec import Rule, Spec
from niels_gpt_contracts.verdict import plan


def _rules(p: plan.Plan) -> list[tuple[Spec, Rule]]:
    return [(s, r) for s, r in p.rules() if r.params.get("tests")]


def request(p: plan.Plan) -> dict[str, list[str]] | None:
    """What ``ops_plugin`` records in the reference run, or ``None`` (no rule asks)."""
    rules = _rules(p)
    if not rules:
        return None
    patterns = sorted({pat for _, r in rules for pat in r.params["ops"]})
    tests = sorted({d for s, _ in rules for d in (f"{s.package}/tests/", f"{s.acceptance_dir}/")})
    return {"patterns": patterns, "tests": tests}


def judge(
    p: plan.Plan,
    ref: PytestRun,
    on_base: Callable[[list[str]], PytestRun],
    stage: str,
    check: str,
) -> list[Violation]:
    """Violations of the rules' test halves; ``on_base`` reruns test ids on the base's code."""
    hits = {name: set(t.ops) for name, t in ref.tests.items() if t.ops}
    if not hits:
        return []
    base = on_base(sorted(hits))
    out: list[Violation] = []
    for test, ops in sorted(hits.items()):
        before = base.tests.get(test)
        new = sorted(ops - set(before.ops if before else ()))
        for spec, rule in _rules(p):
            if not test.startswith((f"{spec.package}/tests/", f"{spec.acceptance_dir}/")):
                continue
            broken = [o for o in new if any(fnmatch.fnmatchcase(o, q) for q in rule.params["ops"])]
            if broken:
                message = (
                    f"{test} dispatched {', '.join(broken)} on the PR's code, not on the "
                    f"base's [{rule.message}]"
                )
                out.append(Violation(rule.rule_id, spec.path, rule.line, message, stage, check))
    return out
