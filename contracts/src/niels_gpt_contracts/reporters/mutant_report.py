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

from niels_gpt_contracts.mutants.fates import Fate, MutantsResult, summary, violations
from niels_gpt_contracts.result import REPORT_SCHEMA_VERSION


def _reason(v: Fate) -> str:
    return f"cached: {v.reason}" if v.cached else v.reason


def render_text(result: MutantsResult) -> str:
    lines = [f"MUTANT {v.mutant.name} {v.status} ({_reason(v)})" for v in result.fates]
    for v in result.fates:
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
            for v in result.fates
        ],
        "violations": [asdict(v) for v in violations(result)],
        "summary": summary(result),
        "killed": result.killed,
        "total": len(result.fates),
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
