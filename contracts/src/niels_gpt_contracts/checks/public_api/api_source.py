"""The public API read from the source as well: the ``def`` that really runs.

``inspect.signature`` believes an assigned ``__signature__`` and a decorator's
``__wrapped__``; the ``def`` statement does not lie. For every function and
method the spec pins, the probe reports where the running code was written
(file, first line, name, see ``_api_probe.code_origin``). This module finds that
``def`` in the tree with ``ast`` and reads its signature (the comparison
with the spec is done on the inspected one, in ``api``):

- ``api.source``: the source signature differs from what ``inspect`` reports
  (an assigned ``__signature__``, a decorator that hides or adds parameters),
  or the running code cannot be found in the tree at all.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

from niels_gpt_contracts.checks.public_api.answer import Origin
from niels_gpt_contracts.checks.public_api.signatures import compare_signatures, from_def, render
from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.rules import Rule

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
API_SOURCE = Rule(
    "api.source",
    "The reported signature is not the code that runs.",
    "The signature inspect reports must be that of the def that runs: an assigned "
    "__signature__ or a decorator that hides the function, or running code that is "
    "not in the tree, would let the API check pass on something else.",
    "Remove the __signature__ assignment or the hiding wrapper; define the function "
    "in the stage's module.",
)

Finding = tuple[str, str, str | None, int | None]  # rule, message, path, line


def find_def(text: str, name: str, line: int) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
    """The ``def name`` whose first line (decorators included) is ``line``."""
    try:
        module = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(module):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            if line in (first, node.lineno):
                return node
    return None


def dataclass_init(text: str, name: str, line: int) -> dict[str, Any] | None:
    """The ``__init__`` a ``@dataclass`` class generates, read from its annotated fields."""
    try:
        module = ast.parse(text)
    except SyntaxError:
        return None
    for node in ast.walk(module):
        if isinstance(node, ast.ClassDef) and node.name == name:
            first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
            decorated = any("dataclass" in ast.unparse(d) for d in node.decorator_list)
            if line not in (first, node.lineno) or not decorated:
                return None
            fields = [
                s
                for s in node.body
                if isinstance(s, ast.AnnAssign)
                and isinstance(s.target, ast.Name)
                and "ClassVar" not in ast.unparse(s.annotation)
            ]
            every = any(_keyword(d, "kw_only") for d in node.decorator_list)
            positional, keyword = _init_params(fields, every)
            params = ", ".join([*positional, *(["*", *keyword] if keyword else [])])
            func = ast.parse(f"def __init__(self, {params}) -> None:\n    pass\n").body[0]
            assert isinstance(func, ast.FunctionDef)
            return from_def(func)
    return None


def _keyword(node: ast.expr, name: str) -> bool:
    """Whether ``node`` is a call (``dataclass(...)``, ``field(...)``) given ``name=True``."""
    return isinstance(node, ast.Call) and any(
        k.arg == name and isinstance(k.value, ast.Constant) and k.value.value is True
        for k in node.keywords
    )


def _init_params(fields: list[ast.AnnAssign], every: bool) -> tuple[list[str], list[str]]:
    """The generated ``__init__``'s positional and keyword-only parameters, as source.

    A field is keyword-only under ``@dataclass(kw_only=True)`` (``every``), after a
    ``_: KW_ONLY`` marker, or as ``field(..., kw_only=True)``; the generated
    ``__init__`` lists those after the others. ``field(default=X)`` shows ``= X``.
    """
    positional: list[str] = []
    keyword: list[str] = []
    after_marker = False
    for f in fields:
        if "KW_ONLY" in ast.unparse(f.annotation):
            after_marker = True
            continue
        value = f.value
        is_field = isinstance(value, ast.Call) and ast.unparse(value.func).endswith("field")
        if is_field and isinstance(value, ast.Call):
            given = [k.value for k in value.keywords if k.arg == "default"]
            value = given[0] if given else None
        text = ast.unparse(ast.AnnAssign(target=f.target, annotation=f.annotation, simple=1))
        text += f" = {ast.unparse(value)}" if value is not None else ""
        kw = every or after_marker or (f.value is not None and _keyword(f.value, "kw_only"))
        (keyword if kw else positional).append(text)
    return positional, keyword


def judge_source(
    label: str,
    inspected: Mapping[str, Any],
    origin: Origin | None,
    tree: Tree,
    *,
    is_init: bool = False,
) -> list[Finding]:
    """Findings for one function or method (``label`` prefixes each message)."""
    if origin is None:
        return [
            (
                API_SOURCE.id,
                f"{label}the code that runs is not defined in the tree under check "
                "(assigned from elsewhere, or built at run time), so its signature "
                "cannot be read from source",
                None,
                None,
            )
        ]
    path, line, name = origin.file, origin.line, origin.name
    text = tree.read(path)
    written: Mapping[str, Any] | None = None
    if text is not None and origin.dataclass:
        written = dataclass_init(text, name, line)
    elif text is not None:
        node = find_def(text, name, line)
        written = from_def(node) if node is not None else None
    if written is None:
        what = f"@dataclass class {name}" if origin.dataclass else f"def {name}"
        return [
            (API_SOURCE.id, f"{label}expected a '{what}' at {path}:{line}, found none", path, line)
        ]
    if not compare_signatures(written, inspected, is_init=is_init):
        return []  # the spec comparison of the inspected signature speaks for both
    return [
        (
            API_SOURCE.id,
            f"{label}inspect reports {render(inspected)} but the def says "
            f"{render(written)}: an assigned __signature__ or a decorator changes "
            "what callers are told",
            path,
            line,
        )
    ]
