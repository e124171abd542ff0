"""Static rules, read from source with ``ast`` (nothing is imported).

Kinds:

- ``import_as_module``: ``module`` is bound as a module object (``import m as
  x`` or ``from parent import m``); its ``attributes`` are only ever called
  through it (``x.attr(...)``), never imported by name, never bound to a
  name; each of ``require_call`` is called at least once.
- ``forbidden_name``: none of ``names`` appears as a name, an attribute, an
  imported name or a string argument (``getattr(F, "name")``).
- ``forbidden_in_function``: inside ``function`` (and, with
  ``follow_local_calls``, the module-level helpers it calls, transitively) no
  method call matches ``methods`` and no plain call matches ``functions``.
- ``dependencies``: ``[project].dependencies`` of ``pyproject`` names exactly
  the distributions in ``allowed``.
"""

from __future__ import annotations

import ast
import fnmatch
from collections.abc import Iterator, Mapping

import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.spec import Rule, Spec

Finding = tuple[str | None, int | None, str]


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return f"{inner}.{node.attr}" if inner else None
    return None


def _parents(tree: ast.AST) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _sources(rule: Rule, tree: Tree, files: list[str]) -> Iterator[tuple[str, ast.Module | str]]:
    """``(path, module)`` for each matched Python file, or ``(path, error)``."""
    matcher = rule.patterns()
    paths = [f for f in files if f.endswith(".py") and matcher.match_file(f)]
    for path, text in tree.read_many(paths).items():
        if text is None:
            continue
        try:
            yield path, ast.parse(text)
        except SyntaxError as err:
            yield path, f"line {err.lineno}: {err.msg}"


def _import_as_module(rule: Rule, tree: Tree, files: list[str]) -> list[Finding]:
    module: str = rule.params["module"]
    attrs = set(rule.params["attributes"])
    required = set(rule.params.get("require_call", []))
    parent_mod, _, leaf = module.rpartition(".")
    found: list[Finding] = []
    called: set[str] = set()
    seen_files: list[str] = []
    for path, mod in _sources(rule, tree, files):
        seen_files.append(path)
        if isinstance(mod, str):
            found.append((path, None, f"cannot parse ({mod})"))
            continue
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
        parents = _parents(mod)
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
                f"object in files {list(rule.params['files'])}, found none",
            )
        )
    return found


def _forbidden_name(rule: Rule, tree: Tree, files: list[str]) -> list[Finding]:
    names = set(rule.params["names"])
    found: list[Finding] = []
    for path, mod in _sources(rule, tree, files):
        if isinstance(mod, str):
            found.append((path, None, f"cannot parse ({mod})"))
            continue
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
        found.extend((path, line, f"uses forbidden name '{name}'") for line, name in sorted(hits))
    return found


def _forbidden_in_function(rule: Rule, tree: Tree, files: list[str]) -> list[Finding]:
    target: str = rule.params["function"]
    methods: list[str] = rule.params.get("methods", [])
    functions: list[str] = rule.params.get("functions", [])
    follow = bool(rule.params.get("follow_local_calls", False))
    found: list[Finding] = []
    located = False
    seen_files: list[str] = []
    for path, mod in _sources(rule, tree, files):
        seen_files.append(path)
        if isinstance(mod, str):
            found.append((path, None, f"cannot parse ({mod})"))
            continue
        defs = {
            n.name: n for n in mod.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
        }
        if target not in defs:
            continue
        located = True
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
    if not located:
        found.append(
            (
                seen_files[0] if seen_files else None,
                None,
                f"expected a module-level function '{target}' in files "
                f"{list(rule.params['files'])}, found none",
            )
        )
    return found


def _line_of(text: str, needle: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return None


def _dependencies(rule: Rule, tree: Tree, files: list[str]) -> list[Finding]:
    path: str = rule.params["pyproject"]
    allowed = {canonicalize_name(n) for n in rule.params["allowed"]}
    text = tree.read(path)
    if text is None:
        return [(path, None, "expected a pyproject.toml here, found none")]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        return [(path, None, f"expected valid TOML, found: {err}")]
    deps = data.get("project", {}).get("dependencies", [])
    if not isinstance(deps, list):
        return [
            (
                path,
                _line_of(text, "dependencies"),
                f"expected [project].dependencies to be a list, found {type(deps).__name__}",
            )
        ]
    found: list[Finding] = []
    declared: set[str] = set()
    for dep in deps:
        try:
            name = canonicalize_name(Requirement(str(dep)).name)
        except InvalidRequirement as err:
            found.append((path, _line_of(text, str(dep)), f"invalid requirement {dep!r}: {err}"))
            continue
        declared.add(name)
        if name not in allowed:
            found.append(
                (
                    path,
                    _line_of(text, str(dep)),
                    f"new runtime dependency {dep!r}; allowed: {sorted(allowed)}",
                )
            )
    for name in sorted(allowed - declared):
        found.append(
            (
                path,
                _line_of(text, "dependencies"),
                f"expected dependency {name!r} declared, found it missing",
            )
        )
    return found


_KINDS = {
    "import_as_module": _import_as_module,
    "forbidden_name": _forbidden_name,
    "forbidden_in_function": _forbidden_in_function,
    "dependencies": _dependencies,
}


def check_static(
    spec: Spec, tree: Tree, changed_lines: Mapping[str, set[int]] | None = None
) -> list[Violation]:
    """Every static rule of ``spec`` on ``tree``; ``changed_lines`` marks PR lines.

    Runtime rules (``forbidden_ops``) are judged by ``contracts pr``, which runs
    their drivers; they are skipped here.
    """
    files = tree.files()
    out: list[Violation] = []
    for rule in spec.rules:
        if rule.runtime:
            continue
        for path, line, message in _KINDS[rule.kind](rule, tree, files):
            changed = bool(
                changed_lines is not None
                and path is not None
                and path in changed_lines
                and (line is None or line in changed_lines[path])
            )
            out.append(
                Violation(
                    rule.rule_id,
                    path,
                    line,
                    f"{message} [{rule.message}]",
                    spec.id,
                    "static",
                    changed=changed,
                )
            )
    return out
