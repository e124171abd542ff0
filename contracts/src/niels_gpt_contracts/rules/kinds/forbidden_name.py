"""``forbidden_name``: none of ``names`` appears in the matched files as a name, an
attribute, an imported name or a string argument (``getattr(F, "name")``)."""

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


def _hits(mod: ast.Module, names: set[str]) -> set[tuple[int, str]]:
    hits: set[tuple[int, str]] = set()
    for node in ast.walk(mod):
        if isinstance(node, ast.Name) and node.id in names:
            hits.add((node.lineno, node.id))
        elif isinstance(node, ast.Attribute) and node.attr in names:
            hits.add((node.lineno, node.attr))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                for part in (alias.name.rsplit(".", 1)[-1], alias.asname):
                    if part is not None and part in names:
                        hits.add((node.lineno, part))
        elif isinstance(node, ast.Call):
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value in names:
                    hits.add((node.lineno, str(arg.value)))
    return hits


def check(params: Mapping[str, Any], tree: Source, files: list[str]) -> list[Finding]:
    names = set(params["names"])
    found: list[Finding] = []
    for path, mod in parsed_sources(params, tree, files):
        if isinstance(mod, str):
            found.append((path, None, f"cannot parse ({mod})"))
            continue
        hits = sorted(_hits(mod, names))
        found.extend((path, line, f"uses forbidden name '{name}'") for line, name in hits)
    return found


KIND = RuleKind(
    "forbidden_name",
    "none of the listed names appears in the stage's code, as a name, an "
    "attribute, an import or a string argument",
    {
        "files": {"$ref": "#/$defs/patterns"},
        "names": {"type": "array", "minItems": 1, "items": {"type": "string"}},
    },
    ("files", "names"),
    check,
    patterns_problem,
)
