"""JSON: ``{"schema_version", "ok", "mode", "stages", "outcomes", "violations",
"summary", "phases", "seconds", ...}``, described by ``specs/report.schema.json`` (whose version
is ``schema_version``).

Each violation has ``rule``, ``path``, ``line`` (or null), ``message``,
``stage``, ``check`` and ``changed``. An error run prints ``"ok": false`` and
an ``"error"`` string, with no verdict.
"""

from __future__ import annotations

import json
from dataclasses import asdict

from niels_gpt_contracts.reporters.common import ordered, summary
from niels_gpt_contracts.result import REPORT_SCHEMA_VERSION, Result


def render(result: Result) -> str:
    payload = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "ok": result.ok,
        "mode": result.mode,
        "stages": {s: result.stage_status(s) for s in result.stages},
        "base": result.base,
        "head": result.head,
        "merge_base": result.merge_base,
        "changed_paths": result.changed_paths,
        "outcomes": [
            {"stage": o.stage, "check": o.check, "status": o.status, "summary": o.summary}
            for o in result.outcomes
        ],
        "violations": [asdict(v) for v in ordered(result.violations)],
        "summary": summary(result),
        "phases": [{"phase": n, "seconds": round(s, 2)} for n, s in result.phases],
        "seconds": round(result.seconds, 2) if result.seconds is not None else None,
    }
    return json.dumps(payload, indent=2) + "\n"


def render_error(message: str) -> str:
    payload = {
        "schema_version": REPORT_SCHEMA_VERSION,
        "ok": False,
        "error": message,
        "violations": [],
    }
    return json.dumps(payload, indent=2) + "\n"
