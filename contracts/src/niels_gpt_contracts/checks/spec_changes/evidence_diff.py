"""What an amendment changes in a stage's evidence: the maintainers' drivers and tests.

An amendment may add acceptance tests and runtime drivers under
``specs/<stage>/`` (and, when it is a declared break, rewrite the stage's own
tests). A spec cannot say whether an edited test got stricter or looser, so
the files are compared definition by definition (``ast``, docstrings left
out, so reflowed prose is no change):

- a new function, class or method, a new module-level statement (a
  constant): ``ADDITIVE``, evidence added;
- a removed or edited function, method or statement: ``BREAKING``, evidence
  that decided the old contract is gone or different;
- a file that is not Python: any edit or removal is ``BREAKING``;
- a Python file that does not parse on the head: ``BREAKING``.

A file absent on one side is compared with an empty one (a new file adds
its definitions; a file of docstring alone is no evidence either way). A
file git shows renamed is compared with its old self.

**Imports count through what they load.** An import statement decides
nothing itself; what a file asserts is in its definitions and statements.
So imports are left out of those, and each name the definitions and
statements use is resolved to what it loads: ``"torch"``, ``"typing:Any"``,
or a spec-side file (``file:specs/...``, a module of the spec kit or one
beside the file, named after its stage). A used name that loads something
else on the head is ``BREAKING``; one newly imported is ``ADDITIVE``; an
import nothing uses is no evidence. Loading a spec-side file by path is an
import written longhand, and is read as one: the statements of an
``importlib.util.spec_from_file_location`` load bind the module to its file,
a function whose body only loads a file (a by-path loader, or ``import x``
and ``return x``) binds its name to that file, and a call of a loader
taking the module's name (``_beside("x")``) reads as the name ``x``; and
``a, b = m.a, m.b`` of such a module reads as ``from m import a, b``. A base
file is resolved through the range's renames, so a file moved with its
loads turned into imports compares equal when nothing else moved.
"""

from __future__ import annotations

import ast
import copy
import posixpath
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

from niels_gpt_contracts.checks.spec_changes.spec_diff import Change
from niels_gpt_contracts.stagespec import KIT_DIR, KIT_PACKAGE

LOADS = frozenset({"spec_from_file_location", "module_from_spec", "exec_module"})


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


def _path_of(node: ast.expr, here: str, local: Mapping[str, str]) -> str | None:
    """A ``Path(__file__)`` expression as a posix path (``{param}`` kept as written)."""
    if isinstance(node, ast.Name):
        return local.get(node.id)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Path":
        if len(node.args) == 1 and isinstance(node.args[0], ast.Name):
            return here if node.args[0].id == "__file__" else None
        return None
    if isinstance(node, ast.Attribute) and node.attr == "parent":
        inner = _path_of(node.value, here, local)
        return posixpath.dirname(inner) if inner is not None else None
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute):
        inner = _path_of(node.value.value, here, local)
        index = node.slice
        up = index.value if isinstance(index, ast.Constant) else None
        if node.value.attr == "parents" and inner is not None and isinstance(up, int):
            for _ in range(up + 1):
                inner = posixpath.dirname(inner)
            return inner
        return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        left, right = _path_of(node.left, here, local), _text(node.right)
        return posixpath.join(left, right) if left is not None and right is not None else None
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "with_name"
        and len(node.args) == 1
    ):
        inner, name = _path_of(node.func.value, here, local), _text(node.args[0])
        if inner is not None and name is not None:
            return posixpath.join(posixpath.dirname(inner), name)
    return None


def _text(node: ast.expr) -> str | None:
    """A string literal, or an f-string of names (``f"{name}.py"`` -> ``{name}.py``)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        parts = []
        for value in node.values:
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                parts.append(value.value)
            elif isinstance(value, ast.FormattedValue) and isinstance(value.value, ast.Name):
                parts.append("{" + value.value.id + "}")
            else:
                return None
        return "".join(parts)
    return None


def _is_call_of(node: ast.AST, attr: str, nargs: int) -> bool:
    """Whether ``node`` is a call ``<x>.<attr>(...)`` with ``nargs`` positional arguments."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == attr
        and len(node.args) == nargs
    )


def _calls_load(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Attribute) and n.attr in LOADS for n in ast.walk(node))


@dataclass
class _Reader:
    """One file read as evidence: its definitions, statements and what its names load."""

    path: str
    named: dict[str, str] = field(default_factory=dict)
    other: Counter[str] = field(default_factory=Counter)
    binds: dict[str, str] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)
    loaders: dict[str, str] = field(default_factory=dict)  # loader taking a name -> template

    def stage_module(self, module: str) -> str | None:
        """The spec-side file a module name imports (``file:...``): a module of the kit
        (``speckit.x``) or one beside this file named after its stage; else ``None``."""
        parts, stage = module.split("."), self.path.split("/")[1:2]
        if len(parts) == 2 and parts[0] == KIT_PACKAGE:
            return f"file:{KIT_DIR}/{KIT_PACKAGE}/{parts[1]}.py"
        if len(parts) == 1 and stage and module.startswith(f"{stage[0]}_"):
            return f"file:{posixpath.join(posixpath.dirname(self.path), module)}.py"
        return None

    def imports(self, node: ast.Import | ast.ImportFrom) -> None:
        """Bind each name an import statement binds to what it loads."""
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = alias.name if alias.asname else alias.name.split(".")[0]
                self.binds[alias.asname or target] = self.stage_module(target) or target
            return
        module = "." * node.level + (node.module or "")
        for alias in node.names:
            name = alias.asname or alias.name
            if node.level == 0 and (found := self.stage_module(f"{module}.{alias.name}")):
                self.binds[name] = found  # a module of its own: from speckit import sweeps
                continue
            owner = self.stage_module(module) if node.level == 0 else None
            self.binds[name] = f"{owner or module}:{alias.name}"

    def loader(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
        """Whether ``node`` only loads a file; its name is then bound to it."""
        body = _strip_docstring(node.body)
        if (
            len(body) == 2
            and isinstance(body[0], ast.Import)
            and len(body[0].names) == 1
            and isinstance(body[1], ast.Return)
            and (found := self.stage_module(body[0].names[0].name)) is not None
        ):
            self.binds[node.name] = found
            return True
        if not _calls_load(node):
            return False
        local: dict[str, str] = {}
        target = None
        for stmt in ast.walk(node):
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                name = stmt.targets[0]
                if isinstance(name, ast.Name) and (p := _path_of(stmt.value, self.path, local)):
                    local[name.id] = p
            if isinstance(stmt, ast.Call) and _is_call_of(stmt, "spec_from_file_location", 2):
                target = _path_of(stmt.args[1], self.path, local)
        if target is None:
            return False
        params = [a.arg for a in node.args.args]
        if len(params) == 1 and "{" + params[0] + "}" in target:
            self.loaders[node.name] = target.replace("{" + params[0] + "}", "{}")
        else:
            self.binds[node.name] = f"file:{target}"
        return True

    def module_load(self, stmt: ast.stmt, specs: dict[str, str]) -> bool:
        """Whether a module-level statement is part of a by-path load (bound as an import)."""
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
            if isinstance(target, ast.Name) and isinstance(value, ast.Call):
                func = value.func
                if isinstance(func, ast.Attribute) and func.attr == "spec_from_file_location":
                    where = _path_of(value.args[1], self.path, {}) if len(value.args) == 2 else None
                    if where is not None:
                        specs[target.id] = where
                        return True
                if isinstance(func, ast.Attribute) and func.attr == "module_from_spec":
                    arg = value.args[0] if value.args else None
                    if isinstance(arg, ast.Name) and arg.id in specs:
                        self.binds[target.id] = f"file:{specs[arg.id]}"
                        return True
        if self.aliases(stmt):
            return True
        names = {n.id for n in ast.walk(stmt) if isinstance(n, ast.Name)}
        return bool(names & set(specs)) and isinstance(stmt, (ast.Assert, ast.Expr))

    def aliases(self, stmt: ast.stmt) -> bool:
        """``a, b = m.a, m.b`` with ``m`` a spec-side module: ``from m import a, b``
        written longhand, bound as such."""
        if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
            return False
        target, value = stmt.targets[0], stmt.value
        names = target.elts if isinstance(target, ast.Tuple) else [target]
        values = value.elts if isinstance(value, ast.Tuple) else [value]
        pairs = list(zip(names, values, strict=False))
        if len(names) != len(values) or not all(
            isinstance(n, ast.Name)
            and isinstance(v, ast.Attribute)
            and isinstance(v.value, ast.Name)
            and v.attr == n.id
            and self.binds.get(v.value.id, "").startswith("file:")
            for n, v in pairs
        ):
            return False
        for n, v in pairs:
            assert isinstance(n, ast.Name) and isinstance(v, ast.Attribute)
            assert isinstance(v.value, ast.Name)
            self.binds[n.id] = f"{self.binds[v.value.id]}:{v.attr}"
        return True

    def resolve_calls(self, node: ast.AST) -> ast.AST:
        """``node`` with each call of a loader taking a name read as that name."""
        loaders = self.loaders

        class Calls(ast.NodeTransformer):
            def visit_Call(self, call: ast.Call) -> ast.AST:
                func = call.func
                if (
                    isinstance(func, ast.Name)
                    and func.id in loaders
                    and len(call.args) == 1
                    and isinstance(call.args[0], ast.Constant)
                    and isinstance(call.args[0].value, str)
                ):
                    module = call.args[0].value
                    binds.setdefault(module, f"file:{loaders[func.id].format(module)}")
                    return ast.copy_location(ast.Name(id=module, ctx=ast.Load()), call)
                return self.generic_visit(call)

        binds = self.binds
        resolved: ast.AST = Calls().visit(copy.deepcopy(node))
        return resolved


def _walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str | None, ast.AST]]:
    """``(qualified name, node)`` of each definition; ``(None, node)`` of other statements."""
    for node in _strip_docstring(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bare = copy.copy(node)
            bare.body = _strip_docstring(node.body)
            yield f"{prefix}{node.name}", bare
        elif isinstance(node, ast.ClassDef):
            yield from _walk(node.body, f"{prefix}{node.name}.")
            shell = copy.copy(node)
            shell.body = []  # the header only: bases, keywords, decorators
            yield f"{prefix}{node.name}", shell
        else:
            yield None, node


def _read(path: str, text: str) -> _Reader | None:
    """``text`` read as evidence; ``None`` if it does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    r = _Reader(path)
    specs: dict[str, str] = {}
    kept: list[ast.stmt] = []
    for stmt in _strip_docstring(tree.body):
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            r.imports(stmt)
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and r.loader(stmt):
            continue
        elif not r.module_load(stmt, specs):
            kept.append(stmt)
    for name, node in _walk(kept, ""):
        resolved = r.resolve_calls(node)
        r.used |= {n.id for n in ast.walk(resolved) if isinstance(n, ast.Name)}
        if name is None:
            r.other[ast.dump(resolved)] += 1
        else:
            r.named[name] = ast.dump(resolved)
    return r


def _bindings(base: _Reader, head: _Reader, renames: Mapping[str, str]) -> list[Change]:
    """What each name the evidence uses loads, base against head (base files renamed)."""

    def moved(target: str | None) -> str | None:
        if target is None or not target.startswith("file:"):
            return target
        where, _, attr = target.removeprefix("file:").partition(":")
        return "file:" + renames.get(where, where) + (f":{attr}" if attr else "")

    out: list[Change] = []
    used = (base.used & set(base.binds)) | (head.used & set(head.binds))
    for name in sorted(used):
        was, now = moved(base.binds.get(name)), head.binds.get(name)
        if was == now:
            continue
        if was is None:
            out.append(Change("ADDITIVE", f"{head.path}: {name} imported ({now})"))
        elif now is None:
            out.append(Change("BREAKING", f"{head.path}: {name} no longer imported ({was})"))
        else:
            out.append(Change("BREAKING", f"{head.path}: {name} loads {now}, was {was}"))
    return out


def compare_file(
    path: str,
    base: str | None,
    head: str | None,
    renames: Mapping[str, str] | None = None,
    base_path: str | None = None,
) -> list[Change]:
    """The evidence changes of one file (``None``: absent on that side).

    ``base_path``: where the base's copy was, for a file git shows renamed;
    ``renames``: old path -> new path of every rename in the range.
    """
    if base == head and (base_path or path) == path:
        return []
    if not path.endswith(".py"):
        if head is None:
            return [Change("BREAKING", f"{path} removed")]
        if base is None:
            return [Change("ADDITIVE", f"{path} added")]
        return [] if base == head else [Change("BREAKING", f"{path} edited")]
    b, h = _read(base_path or path, base or ""), _read(path, head or "")
    if h is None:
        return [Change("BREAKING", f"{path} does not parse")]
    if b is None:
        return [Change("ADDITIVE", f"{path} parses again")]
    (bn, bo), (hn, ho) = (b.named, b.other), (h.named, h.other)
    if head is None:
        return [Change("BREAKING", f"{path} removed")] if bn or bo else []
    if base is None:
        return [Change("ADDITIVE", f"{path} added")] if hn or ho else []
    out = [Change("ADDITIVE", f"{path}::{n} added") for n in sorted(set(hn) - set(bn))]
    out += [Change("BREAKING", f"{path}::{n} removed") for n in sorted(set(bn) - set(hn))]
    out += [
        Change("BREAKING", f"{path}::{n} edited")
        for n in sorted(set(bn) & set(hn))
        if bn[n] != hn[n]
    ]
    gone, new = bo - ho, ho - bo
    if gone:
        out.append(
            Change(
                "BREAKING", f"{path}: {sum(gone.values())} module statement(s) edited or removed"
            )
        )
    if new:
        out.append(Change("ADDITIVE", f"{path}: {sum(new.values())} module statement(s) added"))
    return out + _bindings(b, h, renames or {})
