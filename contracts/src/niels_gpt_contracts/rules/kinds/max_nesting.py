"""``max_nesting``: no function of the matched files nests its blocks (``if``,
``for``, ``while``, ``with``, ``try``, ``match`` and their async forms) more
than ``depth`` deep. A function or class defined inside one counts afresh:
it is its own unit to read. Each function over the bound is one finding, at
its deepest block."""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from niels_gpt_contracts.rules.spec_rules import (
    Finding,
    RuleKind,
    Source,
    parsed_sources,
    patterns_problem,
)

BLOCKS = (ast.If, ast.For, ast.AsyncFor, ast.While, ast.With, ast.AsyncWith, ast.Try, ast.Match)
UNITS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def _deepest(body: list[ast.stmt], level: int = 0) -> tuple[int, int | None]:
    """``(deepest block level, line of the first block at it)`` under ``body``, which
    sits at ``level``; a nested function or class is skipped (its own unit)."""
    best, line = level, None
    for stmt in body:
        if isinstance(stmt, UNITS) or not isinstance(stmt, BLOCKS):
            continue
        children = [
            s for field in ("body", "orelse", "finalbody") for s in getattr(stmt, field, [])
        ]
        children += [s for h in getattr(stmt, "handlers", []) for s in h.body]
        children += [s for c in getattr(stmt, "cases", []) for s in c.body]
        depth, at = _deepest(children, level + 1)
        if depth > best:
            best, line = depth, at if at is not None else stmt.lineno
    return best, line


def check(params: Mapping[str, Any], tree: Source, files: list[str]) -> list[Finding]:
    bound: int = params["depth"]
    found: list[Finding] = []
    for path, mod in parsed_sources(params, tree, files):
        if isinstance(mod, str):
            found.append((path, None, f"cannot parse ({mod})"))
            continue
        for node in ast.walk(mod):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                depth, line = _deepest(node.body)
                if depth > bound:
                    found.append(
                        (
                            path,
                            line,
                            f"function {node.name!r} nests {depth} blocks deep (at most {bound})",
                        )
                    )
    return sorted(found, key=lambda f: (f[0] or "", f[1] or 0))


KIND = RuleKind(
    "max_nesting",
    "no function of the stage's code nests its blocks deeper than the rule's depth",
    {
        "files": {"$ref": "#/$defs/patterns"},
        "depth": {
            "type": "integer",
            "minimum": 1,
            "description": "The deepest block nesting a function may reach (if, for, while, "
            "with, try, match); functions and classes defined inside count afresh.",
        },
    },
    ("files", "depth"),
    check,
    patterns_problem,
)
