"""SARIF 2.1.0 for GitHub code scanning: one run; the tool's rules; one
result per violation.

Rules: every fixed id of ``rule_index.RULES``, and every spec-defined rule of the
judged stages as ``static.<id>/<stage>`` (two stages may define
``static.dependencies`` with different texts: each keeps its own). Each rule
has a short and a full description and help, as GitHub requires.

Results: the rule, the message, a location (a violation about no file points
at its stage's spec; a file-level one at line 1, since GitHub requires a
start line) and a ``partialFingerprints`` entry, so two violations on one
line stay two alerts.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from importlib.metadata import PackageNotFoundError, version
from typing import Any
from urllib.parse import quote

from niels_gpt_contracts.reporters.common import ordered, summary
from niels_gpt_contracts.reporters.rule_index import RULES, rule_doc, spec_rule
from niels_gpt_contracts.result import Result, RuleDoc, Violation
from niels_gpt_contracts.stagespec import spec_path

SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
TOOL = "niels-gpt-contracts"
INFORMATION_URI = "https://github.com/niels-gpt/niels_gpt/tree/main/contracts"
FINGERPRINT = "contractsViolation/v1"


def tool_version() -> str:
    try:
        return version(TOOL)
    except PackageNotFoundError:  # run from a source tree that is not installed
        return "0+unknown"


def _uri(path: str) -> str:
    return quote(path.encode("utf-8", "surrogateescape"), safe="/")


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?")) else f"{text}."


def _name(rule_id: str) -> str:
    """``static.no-sdpa/attention`` -> ``StaticNoSdpaAttention``."""
    parts = rule_id.replace("/", ".").replace("-", ".").replace("_", ".").split(".")
    return "".join(p[:1].upper() + p[1:] for p in parts if p)


def _descriptor(rule_id: str, doc: RuleDoc) -> dict[str, Any]:
    return {
        "id": rule_id,
        "name": _name(rule_id),
        "shortDescription": {"text": _sentence(doc.short)},
        "fullDescription": {"text": _sentence(doc.full)},
        "help": {"text": _sentence(doc.help)},
        "defaultConfiguration": {"level": "error"},
        "properties": {"tags": ["contracts", rule_id.split(".", 1)[0]]},
    }


def rule_id(result: Result, v: Violation) -> str:
    """The SARIF rule id of ``v``: a spec-defined rule is qualified by the
    stage whose spec defines it."""
    own = spec_rule(result, v.rule, v.stage, v.path)
    return f"{v.rule}/{own.stage}" if own is not None else v.rule


def _rules(result: Result, violations: list[Violation]) -> list[dict[str, Any]]:
    docs: dict[str, RuleDoc] = {rid: r.doc for rid, r in RULES.items()}
    for (stage, rule), defined in result.spec_rules.items():
        docs[f"{rule}/{stage}"] = defined.doc()
    for v in violations:
        docs.setdefault(rule_id(result, v), rule_doc(result, v.rule, v.stage, v.path))
    return [_descriptor(rid, docs[rid]) for rid in sorted(docs)]


def _driver(rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "name": TOOL,
        "version": tool_version(),
        "informationUri": INFORMATION_URI,
        "rules": rules,
    }


def _location(result: Result, v: Violation) -> list[dict[str, Any]]:
    path = v.path
    if path is None and v.stage in result.stages:
        path = spec_path(v.stage)
    if path is None:
        return []
    return [
        {
            "physicalLocation": {
                "artifactLocation": {"uri": _uri(path), "uriBaseId": "%SRCROOT%"},
                "region": {"startLine": v.line if v.line is not None else 1},
            }
        }
    ]


def _fingerprint(v: Violation, seen: Counter[tuple[str, ...]]) -> str:
    key = (v.rule, v.stage, v.check, v.path or "", v.message)
    seen[key] += 1
    raw = "\0".join((*key, str(seen[key])))
    return hashlib.sha256(raw.encode("utf-8", "surrogateescape")).hexdigest()


def render(result: Result) -> str:
    violations = ordered(result.violations)
    rules = _rules(result, violations)
    index = {r["id"]: i for i, r in enumerate(rules)}
    seen: Counter[tuple[str, ...]] = Counter()
    results: list[dict[str, Any]] = []
    for v in violations:
        rid = rule_id(result, v)
        item: dict[str, Any] = {
            "ruleId": rid,
            "ruleIndex": index[rid],
            "level": "error",
            "message": {"text": f"[{v.stage}/{v.check}] {v.message}"},
            "partialFingerprints": {FINGERPRINT: _fingerprint(v, seen)},
            "properties": {"stage": v.stage, "check": v.check, "changed": v.changed},
        }
        locations = _location(result, v)
        if locations:
            item["locations"] = locations
        results.append(item)
    run = {
        "tool": {"driver": _driver(rules)},
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
    rules = [_descriptor(rid, r.doc) for rid, r in sorted(RULES.items())]
    run = {
        "tool": {"driver": _driver(rules)},
        "invocations": [
            {
                "executionSuccessful": False,
                "toolExecutionNotifications": [{"level": "error", "message": {"text": message}}],
            }
        ],
        "results": [],
    }
    return json.dumps({"$schema": SCHEMA, "version": "2.1.0", "runs": [run]}, indent=2) + "\n"
