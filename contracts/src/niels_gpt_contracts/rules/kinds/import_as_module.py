"""``import_as_module``: ``module`` is bound as a module object (``import m as x``
or ``from parent import m``); its ``attributes`` are only ever called through
it (``x.attr(...)``), never imported by name, never bound to a name; each of
``require_call`` is called at least once (so a monkeypatch of the module
attribute reaches every call)."""

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


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _aliases(module: str, path: str, mod: ast.Module, found: list[Finding]) -> set[str]:
    """The names ``mod`` binds ``module`` to; a ``from module import x`` is a finding."""
    parent_mod, _, leaf = module.rpartition(".")
    aliases = {module}
    for node in ast.walk(mod):
        if isinstance(node, ast.ImportFrom) and node.level == 0:
            if node.module == module:
                names = ", ".join(a.name for a in node.names)
                found.append(
                    (
                        path,
                        node.lineno,
                        f"'from {module} import {names}' binds "
                        f"names, not the module; use 'import {module} as {leaf}'",
                    )
                )
            elif node.module == parent_mod:
                aliases.update(a.asname or a.name for a in node.names if a.name == leaf)
        elif isinstance(node, ast.Import):
            aliases.update(a.asname for a in node.names if a.name == module and a.asname)
    return aliases


def check(params: Mapping[str, Any], tree: Source, files: list[str]) -> list[Finding]:
    module: str = params["module"]
    attrs = set(params["attributes"])
    required = set(params.get("require_call", []))
    leaf = module.rpartition(".")[2]
    found: list[Finding] = []
    called: set[str] = set()
    seen_files: list[str] = []
    for path, mod in parsed_sources(params, tree, files):
        seen_files.append(path)
        if isinstance(mod, str):
            found.append((path, None, f"cannot parse ({mod})"))
            continue
        aliases = _aliases(module, path, mod, found)
        parents = {child: node for node in ast.walk(mod) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(mod):
            if isinstance(node, ast.Attribute) and node.attr in attrs:
                owner = _dotted(node.value)
                if owner not in aliases:
                    continue
                parent = parents.get(node)
                if isinstance(parent, ast.Call) and parent.func is node:
                    called.add(node.attr)
                else:
                    found.append(
                        (
                            path,
                            node.lineno,
                            f"'{owner}.{node.attr}' is used without "
                            "being called; keep calling it through the module so a "
                            "monkeypatch of the module attribute reaches every call",
                        )
                    )
            elif isinstance(node, ast.Name) and node.id in attrs:
                found.append(
                    (
                        path,
                        node.lineno,
                        f"bare name '{node.id}': call it as "
                        f"'{leaf}.{node.id}(...)' through the module object",
                    )
                )
    for name in sorted(required - called):
        where = seen_files[0] if seen_files else None
        found.append(
            (
                where,
                None,
                f"expected a call '{leaf}.{name}(...)' through the module "
                f"object in files {list(params['files'])}, found none",
            )
        )
    return found


KIND = RuleKind(
    "import_as_module",
    "the module is bound as a module object and its listed attributes "
    "are only called through it, never imported or bound by name",
    {
        "files": {"$ref": "#/$defs/patterns"},
        "module": {"$ref": "#/$defs/dotted"},
        "attributes": {"type": "array", "minItems": 1, "items": {"type": "string"}},
        "require_call": {"type": "array", "items": {"type": "string"}},
    },
    ("files", "module", "attributes"),
    check,
    patterns_problem,
)
