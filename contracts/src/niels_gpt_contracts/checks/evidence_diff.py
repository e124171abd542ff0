"""What an amendment changes in a stage's evidence: the maintainers' drivers and tests.

An amendment may add acceptance tests and runtime drivers under
``specs/<stage>/`` (and, when it is a declared break, rewrite the stage's own
tests). A spec cannot say whether an edited test got stricter or looser, so
the files are compared definition by definition (``ast``, docstrings left
out, so reflowed prose is no change):

- a new file, a new function, class or method, a new module-level statement
  (an import, a constant; each imported name counts as one): ``ADDITIVE``,
  evidence added;
- a removed or edited function, method or statement, a removed file:
  ``BREAKING``, evidence that decided the old contract is gone or different;
- a file that is not Python: any edit or removal is ``BREAKING``;
- a Python file that does not parse on the head: ``BREAKING``.
"""

from __future__ import annotations

import ast
import copy
from collections import Counter
from collections.abc import Iterator

from niels_gpt_contracts.checks.spec_diff import Change

Defs = tuple[dict[str, str], Counter[str]]


def _strip_docstring(body: list[ast.stmt]) -> list[ast.stmt]:
    first = body[0] if body else None
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
    ):
        return body[1:]
    return body


def _walk(body: list[ast.stmt], prefix: str) -> Iterator[tuple[str | None, str]]:
    """``(qualified name, dump)`` of each definition; ``(None, dump)`` of other statements."""
    for node in _strip_docstring(body):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            bare = copy.copy(node)
            bare.body = _strip_docstring(node.body)
            yield f"{prefix}{node.name}", ast.dump(bare)
        elif isinstance(node, ast.ClassDef):
            yield from _walk(node.body, f"{prefix}{node.name}.")
            shell = copy.copy(node)
            shell.body = []  # the header only: bases, keywords, decorators
            yield f"{prefix}{node.name}", ast.dump(shell)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            for alias in node.names:  # one name each: an import that grows only adds
                one = copy.copy(node)
                one.names = [alias]
                yield None, ast.dump(one)
        else:
            yield None, ast.dump(node)


def definitions(text: str) -> Defs | None:
    """Named definitions and the multiset of other statements; ``None`` if it does not parse."""
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    named: dict[str, str] = {}
    other: Counter[str] = Counter()
    for name, dump in _walk(tree.body, ""):
        if name is None:
            other[dump] += 1
        else:
            named[name] = dump
    return named, other


def compare_file(path: str, base: str | None, head: str | None) -> list[Change]:
    """The evidence changes of one file (``None``: absent on that side)."""
    if base == head:
        return []
    if head is None:
        return [Change("BREAKING", f"{path} removed")]
    if base is None:
        return [Change("ADDITIVE", f"{path} added")]
    if not path.endswith(".py"):
        return [Change("BREAKING", f"{path} edited")]
    b, h = definitions(base), definitions(head)
    if h is None:
        return [Change("BREAKING", f"{path} does not parse")]
    if b is None:
        return [Change("ADDITIVE", f"{path} parses again")]
    (bn, bo), (hn, ho) = b, h
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
    return out
