"""Static rule kind ``no_class_switch``: no object's class is replaced in place.

``module.__class__ = Other`` turns a user's object into another class behind
its back: every later call runs code its owner never chose, and a stage can
reach into another stage's objects that way (the in-place switches of
fastpath, kv_cache and padding did, until issue 21 gave them one attention).
A spec switches the ban on for its stage with a rule of this kind; each
assignment to an attribute named ``__class__`` (plain, augmented, annotated,
in a tuple target, or by ``setattr(obj, "__class__", ...)``) in the rule's
files is a violation.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator

from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.spec import Rule

Finding = tuple[str | None, int | None, str]


def _targets(node: ast.AST) -> Iterator[ast.AST]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            yield from _unpack(target)
    elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
        yield node.target


def _unpack(target: ast.AST) -> Iterator[ast.AST]:
    if isinstance(target, (ast.Tuple, ast.List)):
        for item in target.elts:
            yield from _unpack(item)
    elif isinstance(target, ast.Starred):
        yield from _unpack(target.value)
    else:
        yield target


def _switches(tree: ast.Module) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        for target in _targets(node):
            if isinstance(target, ast.Attribute) and target.attr == "__class__":
                yield getattr(node, "lineno", 1), f"assigns {ast.unparse(target)}"
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id == "setattr"
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value == "__class__"
        ):
            yield node.lineno, f"sets __class__ of {ast.unparse(node.args[0])} with setattr"


def no_class_switch(rule: Rule, tree: Tree, files: list[str]) -> list[Finding]:
    """Every ``__class__`` assignment in the rule's files."""
    matcher = rule.patterns()
    paths = [f for f in files if f.endswith(".py") and matcher.match_file(f)]
    found: list[Finding] = []
    for path, text in tree.read_many(paths).items():
        if text is None:
            continue
        try:
            module = ast.parse(text)
        except SyntaxError as err:
            found.append((path, err.lineno, f"cannot parse: {err.msg}"))
            continue
        for line, what in _switches(module):
            found.append((path, line, f"{what}: an object's class is replaced in place"))
    return found
