"""SARIF 2.1.0: one run, the rule ids as the tool's rules (stable: the fixed
ids of ``result.RULES`` and ``static.<spec rule id>``), one result per
violation with its file and line."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from niels_gpt_contracts.reporters.common import ordered, summary
from niels_gpt_contracts.result import RULES, Result

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL = "niels-gpt-contracts"


def _uri(path: str) -> str:
    return quote(path.encode("utf-8", "surrogateescape"), safe="/")


def _driver(rule_ids: list[str], result: Result | None) -> dict[str, Any]:
    return {
        "name": TOOL,
        "informationUri": "https://github.com/niels-gpt/niels_gpt/tree/main/contracts",
        "rules": [
            {
                "id": rid,
                "name": rid.replace(".", "-"),
                "shortDescription": {"text": result.rule_text(rid) if result else RULES[rid]},
                "defaultConfiguration": {"level": "error"},
            }
            for rid in rule_ids
        ],
    }


def render(result: Result) -> str:
    violations = ordered(result.violations)
    rule_ids = sorted({*RULES, *result.rule_texts, *(v.rule for v in violations)})
    index = {rid: i for i, rid in enumerate(rule_ids)}
    results: list[dict[str, Any]] = []
    for v in violations:
        item: dict[str, Any] = {
            "ruleId": v.rule,
            "ruleIndex": index[v.rule],
            "level": "error",
            "message": {"text": f"[{v.stage}/{v.check}] {v.message}"},
        }
        if v.path is not None:
            physical: dict[str, Any] = {
                "artifactLocation": {"uri": _uri(v.path), "uriBaseId": "%SRCROOT%"}
            }
            if v.line is not None:
                physical["region"] = {"startLine": v.line}
            item["locations"] = [{"physicalLocation": physical}]
        results.append(item)
    run = {
        "tool": {"driver": _driver(rule_ids, result)},
        "invocations": [
            {
                "executionSuccessful": True,
                "toolExecutionNotifications": [
                    {"level": "note", "message": {"text": summary(result)}}
                ],
            }
        ],
        "results": results,
    }
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2) + "\n"


def render_error(message: str) -> str:
    run = {
        "tool": {"driver": _driver([], None)},
        "invocations": [
            {
                "executionSuccessful": False,
                "toolExecutionNotifications": [{"level": "error", "message": {"text": message}}],
            }
        ],
        "results": [],
    }
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2) + "\n"
