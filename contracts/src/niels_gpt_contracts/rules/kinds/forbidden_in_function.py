"""``forbidden_in_function``: inside the module-level ``function`` (and, with
``follow_local_calls``, the module-level helpers it calls, transitively) no
method call matches ``methods`` and no plain call matches ``functions``
(fnmatch patterns); the function must exist in the matched files."""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Mapping
from typing import Any

from niels_gpt_contracts.rules.spec_rules import (
    Finding,
    RuleKind,
    Source,
    parsed_sources,
    patterns_problem,
)

Defs = dict[str, ast.FunctionDef | ast.AsyncFunctionDef]


def _walk(params: Mapping[str, Any], path: str, defs: Defs) -> list[Finding]:
    """The forbidden calls reachable from ``function`` in one file's ``defs``."""
    target: str = params["function"]
    methods: list[str] = params.get("methods", [])
    functions: list[str] = params.get("functions", [])
    follow = bool(params.get("follow_local_calls", False))
    found: list[Finding] = []
    queue, visited = [(target, target)], set()
    while queue:
        name, via = queue.pop(0)
        if name in visited:
            continue
        visited.add(name)
        where = target if name == target else f"{name} (called from {via})"
        for node in ast.walk(defs[name]):
            if not isinstance(node, ast.Call):
                continue
            if isinstance(node.func, ast.Attribute):
                if any(fnmatch.fnmatchcase(node.func.attr, p) for p in methods):
                    found.append(
                        (
                            path,
                            node.lineno,
                            f"'.{node.func.attr}(...)' inside "
                            f"{where}: no cast or move in {target}; fail loudly",
                        )
                    )
            elif isinstance(node.func, ast.Name):
                callee = node.func.id
                if any(fnmatch.fnmatchcase(callee, p) for p in functions):
                    found.append(
                        (
                            path,
                            node.lineno,
                            f"'{callee}(...)' inside {where}: forbidden in {target}",
                        )
                    )
                elif follow and callee in defs and callee not in visited:
                    queue.append((callee, where if name != target else target))
    return found


def check(params: Mapping[str, Any], tree: Source, files: list[str]) -> list[Finding]:
    target: str = params["function"]
    found: list[Finding] = []
    located = False
    seen_files: list[str] = []
    for path, mod in parsed_sources(params, tree, files):
        seen_files.append(path)
        if isinstance(mod, str):
            found.append((path, None, f"cannot parse ({mod})"))
            continue
        defs: Defs = {
            n.name: n for n in mod.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        if target in defs:
            located = True
            found += _walk(params, path, defs)
    if not located:
        found.append(
            (
                seen_files[0] if seen_files else None,
                None,
                f"expected a module-level function '{target}' in files "
                f"{list(params['files'])}, found none",
            )
        )
    return found


KIND = RuleKind(
    "forbidden_in_function",
    "no listed method or function is called inside the named "
    "function (and, where the rule says so, the local helpers it calls)",
    {
        "files": {"$ref": "#/$defs/patterns"},
        "function": {"type": "string"},
        "methods": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Method-call names (fnmatch patterns) forbidden as `obj.<name>(...)`.",
        },
        "functions": {
            "type": "array",
            "items": {"type": "string"},
            "description": "Plain call names (fnmatch patterns) forbidden as `<name>(...)`.",
        },
        "follow_local_calls": {
            "type": "boolean",
            "description": "Also check module-level helpers the function calls, transitively.",
        },
    },
    ("files", "function", "methods"),
    check,
    patterns_problem,
)
