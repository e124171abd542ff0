"""Text and JSON output of a mutant run.

Text: one ``MUTANT <stage>.<id> <status> (<reason>)`` line a mutant, then
``killed K/N``. JSON (``specs/report.schema.json``): ``{"schema_version",
"ok", "mode": "mutants", "stages", "clean", "mutants", "violations",
"summary"}``; ``violations`` has the gate's shape (rule ``mutant.survived``,
``mutant.stale`` or ``mutant.error``, placed on the mutant's line in its
spec).
"""

from __future__ import annotations

import json
from dataclasses import asdict

from niels_gpt_contracts.mutants.verdicts import MutantsResult, Verdict
from niels_gpt_contracts.result import REPORT_SCHEMA_VERSION, Violation
from niels_gpt_contracts.rules import RuleDoc

# The rule ids this module emits, each with what SARIF shows of it
# (``reporters.rule_index`` gathers every module's).
RULE_DOCS: dict[str, RuleDoc] = {
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
    "mutant.pending": RuleDoc(
        "A mutant is still marked for re-targeting.",
        "A maintainers' amendment may mark mutants whose code its stage PR rewrites "
        "(retarget = true): that PR's verdict reports them NOT RUN. Outside that verdict the "
        "mark means a known bug goes unchecked, so the mutant gate fails on it.",
        "Rewrite the mutant's find/replace at the new code (the same bug), prove it killed "
        "(nox -s mutants -- --stage S) and remove the mark, in a maintainers' commit.",
    ),
}


def _reason(v: Verdict) -> str:
    return f"cached: {v.reason}" if v.cached else v.reason


def summary(result: MutantsResult) -> str:
    n = len(result.verdicts)
    counts = {
        s: sum(v.status == s for v in result.verdicts)
        for s in ("survived", "stale", "error", "pending")
    }
    extra = ", ".join(f"{c} {s}" for s, c in counts.items() if c)
    text = f"killed {result.killed}/{n}" + (f" ({extra})" if extra else "")
    if result.not_run:
        text += f"; {len(result.not_run)} not run (stopped at the first mutant not killed)"
    return text


def violations(result: MutantsResult) -> list[Violation]:
    return [
        Violation(
            rule=f"mutant.{v.status}",
            path=v.mutant.spec_path,
            line=v.mutant.line,
            message=f"{v.mutant.name}: {v.mutant.text} -> {v.status}: {v.reason}",
            stage=v.mutant.stage,
            check="mutants",
        )
        for v in result.verdicts
        if v.status != "killed"
    ]


def render_text(result: MutantsResult) -> str:
    lines = [f"MUTANT {v.mutant.name} {v.status} ({_reason(v)})" for v in result.verdicts]
    for v in result.verdicts:
        if v.status != "killed":
            lines.append(f"  {v.mutant.name}: {v.mutant.text}")
    lines.append(summary(result))
    return "\n".join(lines) + "\n"


def render_json(result: MutantsResult) -> str:
    payload = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "ok": result.ok,
        "mode": "mutants",
        "stages": result.stages,
        "clean": [
            {"stage": c.stage, "ok": c.ok, "seconds": round(c.seconds, 2), "tests": c.tests}
            for c in result.clean
        ],
        "mutants": [
            {
                "stage": v.mutant.stage,
                "id": v.mutant.id,
                "text": v.mutant.text,
                "file": v.mutant.file,
                "status": v.status,
                "reason": v.reason,
                "cached": v.cached,
                "seconds": round(v.seconds, 2),
            }
            for v in result.verdicts
        ],
        "violations": [asdict(v) for v in violations(result)],
        "summary": summary(result),
        "killed": result.killed,
        "total": len(result.verdicts),
    }
    return json.dumps(payload, indent=2) + "\n"


def render_error(message: str) -> str:
    payload = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "ok": False,
        "mode": "mutants",
        "error": message,
        "violations": [],
    }
    return json.dumps(payload) + "\n"
