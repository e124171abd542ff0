"""Line-scoped permissions: a file may change only inside certain calls.

Kind ``add_keyword`` (seed 004: other stages' tests and scripts may change only
to pass ``V`` to ``ModelConfig(...)``). The file before and after is parsed;
every outermost call to the named callable is masked to a placeholder, and
the masked texts must be identical, line for line, comments included. Then
the calls are paired in order: each changed call must equal its old self
except that it gains the keyword (nothing else in it may change, and an
existing value of the keyword may not change either). The value it gains must
be an int literal, or a module-level name bound exactly once in the same file
to an int literal: a permission to pass a vocabulary size is not a permission
to run code (``V=__import__("os").system(...)``).
"""

from __future__ import annotations

import ast
import difflib

from niels_gpt_contracts.stagespec import LineScope

_MARK = "\x00"


def _outermost_calls(tree: ast.AST, name: str) -> list[ast.Call]:
    found: list[ast.Call] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.Call) and _callee(node) == name:
            found.append(node)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return sorted(found, key=lambda c: (c.lineno, c.col_offset))


def _callee(call: ast.Call) -> str | None:
    if isinstance(call.func, ast.Name):
        return call.func.id
    if isinstance(call.func, ast.Attribute):
        return call.func.attr
    return None


def _mask(text: str, calls: list[ast.Call], name: str) -> tuple[list[str], list[int]]:
    """Text with each call replaced by ``name(<mark>)``; lines and their origins."""
    raw_lines = text.splitlines(keepends=True)
    starts = [0]
    for line in raw_lines:
        starts.append(starts[-1] + len(line))

    def offset(lineno: int, col: int) -> int:
        line = raw_lines[lineno - 1].encode("utf-8", "surrogateescape")
        return starts[lineno - 1] + len(line[:col].decode("utf-8", "surrogateescape"))

    spans = [
        (offset(c.lineno, c.col_offset), offset(c.end_lineno or c.lineno, c.end_col_offset or 0))
        for c in calls
    ]
    out_lines: list[str] = []
    origins: list[int] = []
    current: list[str] = []
    line_no = 1
    origin = 1
    pos = 0

    def copy(chunk: str) -> None:
        nonlocal line_no, origin, current
        parts = chunk.split("\n")
        for i, part in enumerate(parts):
            current.append(part)
            if i < len(parts) - 1:
                out_lines.append("".join(current))
                origins.append(origin)
                current = []
                line_no += 1
                origin = line_no

    for start, end in spans:
        copy(text[pos:start])
        current.append(f"{name}({_MARK})")
        line_no += text.count("\n", start, end)
        pos = end
    copy(text[pos:])
    if current and "".join(current):
        out_lines.append("".join(current))
        origins.append(origin)
    return out_lines, origins


def _without(call: ast.Call, keyword: str) -> str:
    kept = [kw for kw in call.keywords if kw.arg != keyword]
    return ast.dump(ast.Call(func=call.func, args=call.args, keywords=kept))


def _keyword(call: ast.Call, keyword: str) -> ast.keyword | None:
    return next((kw for kw in call.keywords if kw.arg == keyword), None)


def _int_literal(node: ast.expr | None) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, int)
        and not isinstance(node.value, bool)
    )


def _int_constants(tree: ast.Module) -> set[str]:
    """Names bound exactly once in the module, at its top level, to an int literal."""
    bindings: dict[str, int] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            bindings[node.id] = bindings.get(node.id, 0) + 1
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            bindings[node.name] = bindings.get(node.name, 0) + 1
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:
                name = alias.asname or alias.name.split(".")[0]
                bindings[name] = bindings.get(name, 0) + 1
        elif isinstance(node, (ast.Global, ast.Nonlocal)):
            for name in node.names:
                bindings[name] = bindings.get(name, 0) + 2
    found: set[str] = set()
    for stmt in tree.body:
        target: ast.expr
        value: ast.expr | None
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign):
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Name) and _int_literal(value) and bindings[target.id] == 1:
            found.add(target.id)
    return found


def _value_problem(call: ast.Call, keyword: str, constants: set[str]) -> str | None:
    kw = _keyword(call, keyword)
    value = kw.value if kw is not None else None
    if _int_literal(value) or (isinstance(value, ast.Name) and value.id in constants):
        return None
    shown = ast.unparse(value)[:60] if value is not None else "nothing"
    return (
        f"the added {keyword}= must be an int literal or a module-level name bound once "
        f"to one in this file, found {shown!r}"
    )


def judge(scope: LineScope, base_text: str, head_text: str) -> list[tuple[int, str]]:
    """``(head line, problem)`` for every change the permission does not cover."""
    name, keyword = scope.callable, scope.keyword
    try:
        head_tree = ast.parse(head_text)
    except SyntaxError as err:
        return [
            (
                err.lineno or 1,
                f"cannot parse the changed file ({err.msg}), so no line of "
                f"it can be shown to be a {name}(...) call",
            )
        ]
    try:
        base_tree = ast.parse(base_text)
    except SyntaxError:
        base_tree = ast.Module(body=[], type_ignores=[])
    base_calls = _outermost_calls(base_tree, name)
    head_calls = _outermost_calls(head_tree, name)
    base_lines, _ = _mask(base_text, base_calls, name)
    head_lines, head_origin = _mask(head_text, head_calls, name)

    problems: list[tuple[int, str]] = []
    if base_lines != head_lines:
        matcher = difflib.SequenceMatcher(None, base_lines, head_lines, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                continue
            if j2 > j1:
                for j in range(j1, j2):
                    shown = head_lines[j].replace(f"{name}({_MARK})", f"{name}(...)").strip()
                    problems.append(
                        (
                            head_origin[j],
                            f"changed line is not a {name}(...) call "
                            f"gaining {keyword}=: {shown[:80]!r}",
                        )
                    )
            else:
                at = (
                    head_origin[j1]
                    if j1 < len(head_origin)
                    else (head_origin[-1] if head_origin else 1)
                )
                removed = base_lines[i1].replace(f"{name}({_MARK})", f"{name}(...)").strip()
                problems.append(
                    (
                        at,
                        f"removes {i2 - i1} line(s) outside {name}(...) calls, "
                        f"starting with {removed[:80]!r}",
                    )
                )
        return problems

    constants = _int_constants(head_tree)
    for old, new in zip(base_calls, head_calls, strict=True):
        if ast.dump(old) == ast.dump(new):
            continue
        if _without(old, keyword) != _without(new, keyword):
            problems.append(
                (
                    new.lineno,
                    f"{name}(...) call changes more than adding "
                    f"{keyword}= (its other arguments differ from the base)",
                )
            )
        elif _keyword(old, keyword) is not None:
            problems.append(
                (
                    new.lineno,
                    f"{name}(...) call already passed {keyword}=; "
                    f"changing or removing it is not adding it",
                )
            )
        else:
            problem = _value_problem(new, keyword, constants)
            if problem:
                problems.append((new.lineno, f"{name}(...) call: {problem}"))
    return problems
