"""The real-stage scenarios' edits still find their text in this tree.

Each scenario of ``test_pr_real_*.py`` edits the real stages with
``real_repo.replace(path, old, new)`` before it asks for a verdict. When a
stage's code moves on, ``old`` can vanish, and the scenario then fails before
any verdict; only the slow scenario session (``nox -s test-scenarios``, not a
landing run) would show it, and twice it went unseen (the padding frame lost
its ``set_up`` loop and its ``KVCache`` import). This test reads every
scenario function without running it, follows its ``replace`` calls in order
on a copy of the files they name, and requires each ``old`` to be there.

It follows a call only when its arguments are string constants: literals,
module-level or local names bound to one, ``+``, f-strings and ``str.replace``
of those, and calls of the module's one-``return`` helpers with such
arguments. A function is followed up to its first call it cannot resolve, and
only on files the scenario repository copies verbatim from this checkout
(``realkit``: not a test, not a spec, not the README).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SCENARIOS = sorted(HERE.glob("test_pr_real_*.py"))


class Unresolved(Exception):
    """An argument that is not a string constant."""


@dataclass(frozen=True)
class Module:
    """A scenario module's string constants and functions (its helpers' scope)."""

    names: Mapping[str, str]
    helpers: Mapping[str, ast.FunctionDef]


NO_MODULE = Module({}, {})


def _value(node: ast.expr, names: Mapping[str, str], module: Module = NO_MODULE) -> str:
    """The string ``node`` stands for, or ``Unresolved``; a call of a ``module`` function
    whose body is one ``return`` (a docstring aside) is evaluated in the module's scope."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return _value(node.left, names, module) + _value(node.right, names, module)
    if isinstance(node, ast.JoinedStr):
        parts = []
        for part in node.values:
            if isinstance(part, ast.FormattedValue):
                if part.conversion != -1 or part.format_spec is not None:
                    raise Unresolved(ast.unparse(node))
                parts.append(_value(part.value, names, module))
            else:
                parts.append(_value(part, names, module))
        return "".join(parts)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.keywords:
        return _call(module.helpers.get(node.func.id), node, names, module)
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "replace"
        and len(node.args) == 2
        and not node.keywords
    ):
        base = _value(node.func.value, names, module)
        find, put = (_value(a, names, module) for a in node.args)
        return base.replace(find, put)
    raise Unresolved(ast.unparse(node))


def _call(
    fn: ast.FunctionDef | None, call: ast.Call, names: Mapping[str, str], module: Module
) -> str:
    """A helper's ``return`` value with its parameters bound to the call's arguments."""
    if fn is None:
        raise Unresolved(ast.unparse(call))
    body = [
        s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
    ]
    params = [a.arg for a in fn.args.args]
    if (
        len(body) != 1
        or not isinstance(body[0], ast.Return)
        or body[0].value is None
        or len(params) != len(call.args)
    ):
        raise Unresolved(ast.unparse(call))
    bound = {
        **module.names,
        **{p: _value(a, names, module) for p, a in zip(params, call.args, strict=True)},
    }
    return _value(body[0].value, bound, module)


def _bindings(body: list[ast.stmt], names: dict[str, str]) -> None:
    """Add ``name = <string constant>`` statements of ``body`` to ``names``."""
    for stmt in body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
            if isinstance(target, ast.Name):
                try:
                    names[target.id] = _value(stmt.value, names)
                except Unresolved:
                    names.pop(target.id, None)


def _replaces(fn: ast.FunctionDef) -> list[ast.Call]:
    """``real_repo.replace(...)`` calls of ``fn``, in source order."""
    calls = [
        node
        for node in ast.walk(fn)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "replace"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "real_repo"
    ]
    return sorted(calls, key=lambda c: (c.lineno, c.col_offset))


def _verbatim(path: str) -> bool:
    """Whether the scenario repository holds this checkout's own copy of ``path``."""
    return (
        "/tests/" not in path
        and path != "README.md"
        and not (path.startswith("specs/") and path.endswith(".toml"))
        and (ROOT / path).is_file()
    )


def edits_not_found(source: str) -> tuple[list[str], int, int]:
    """Every edit of a scenario module whose ``old`` text is missing, how many edits
    were followed, and how many ``real_repo.replace`` calls the module has."""
    tree = ast.parse(source)
    constants: dict[str, str] = {}
    _bindings(tree.body, constants)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef)}
    module = Module(constants, functions)
    missing, followed, calls = [], 0, 0
    for fn in functions.values():
        if not fn.name.startswith("test_"):
            continue
        names = dict(constants)
        _bindings(fn.body, names)
        files: dict[str, str] = {}
        replaces = _replaces(fn)
        calls += len(replaces)
        for call in replaces:
            try:
                path, old, new = (_value(a, names, module) for a in call.args)
            except (Unresolved, ValueError):
                break  # not a constant: what the file holds after it is unknown
            if not _verbatim(path):
                break
            text = files.setdefault(path, (ROOT / path).read_text(encoding="utf-8"))
            followed += 1
            if old not in text:
                missing.append(f"{fn.name} (line {call.lineno}): {old[:60]!r} not in {path}")
                break
            files[path] = text.replace(old, new, 1)
    return missing, followed, calls


@pytest.mark.parametrize("module", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_edit_finds_its_text(module: Path) -> None:
    missing, _, _ = edits_not_found(module.read_text(encoding="utf-8"))
    assert missing == [], "\n".join(missing)


def test_the_edits_are_followed_at_all() -> None:
    """A resolver that gave up on every call would pass the test above: most edits are
    constants (52 of 57 followed when this was written)."""
    counts = [edits_not_found(m.read_text(encoding="utf-8"))[1:] for m in SCENARIOS]
    followed, calls = sum(f for f, _ in counts), sum(c for _, c in counts)
    assert calls > 0 and followed >= 0.6 * calls, f"{followed} of {calls} edits followed"


def test_an_edit_whose_text_is_gone_is_named() -> None:
    source = (
        'PAD = "packages/padding/src/niels_gpt/model/padding/_frame.py"\n'
        "def test_x(real_repo):\n"
        '    real_repo.replace(PAD, "import torch\\n", "import torch\\nimport os\\n")\n'
        '    real_repo.replace(PAD, "        for m in set_up:\\n", "")\n'
    )
    missing, followed, calls = edits_not_found(source)
    assert (followed, calls) == (2, 2)
    assert missing == [
        "test_x (line 4): '        for m in set_up:\\n' not in "
        "packages/padding/src/niels_gpt/model/padding/_frame.py"
    ]
