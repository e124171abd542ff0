"""Whether a package's ``__init__.py`` only re-exports its own modules' names.

A spec amendment may move a stage's code without changing it (``amendment``):
a module renamed as it is, or a package's code moved out of its
``__init__.py`` into a named module beside it, verbatim. The ``__init__.py``
left behind must then hold no code of its own, which this module decides from
the syntax alone, never by running it: an optional docstring, ``from __future__
import ...``, imports of plain names from the package's own modules
(``from <package>.<module> import a, b`` or ``from .<module> import a, b``; no
star, no rename, nothing from outside the package) and one ``__all__`` of string
literals. Anything else (a call, a definition, a conditional, an import of
another package) is code, and the amendment check refuses it.
"""

from __future__ import annotations

import ast


def _docstring(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
    )


def _own_import(node: ast.stmt, package: str) -> bool:
    if not isinstance(node, ast.ImportFrom) or node.module is None:
        return False
    if node.module == "__future__" and node.level == 0:
        return True
    if node.level == 0:
        leaf = node.module.removeprefix(f"{package}.")
        inside = leaf != node.module and "." not in leaf
    else:
        inside = node.level == 1 and "." not in node.module
    plain = all(a.name != "*" and a.asname in (None, a.name) for a in node.names)
    return inside and plain


def _all_literal(node: ast.stmt) -> bool:
    if not isinstance(node, ast.Assign) or len(node.targets) != 1:
        return False
    target, value = node.targets[0], node.value
    return (
        isinstance(target, ast.Name)
        and target.id == "__all__"
        and isinstance(value, (ast.List, ast.Tuple))
        and all(isinstance(e, ast.Constant) and isinstance(e.value, str) for e in value.elts)
    )


def reexports_only(text: str | None, package: str) -> bool:
    """Whether ``text``, the ``__init__.py`` of import package ``package`` (for example
    ``niels_gpt.model.rope``), only re-exports names of that package's own modules.

    ``None`` (no such file) and text that does not parse are not.
    """
    if text is None:
        return False
    try:
        body = ast.parse(text).body
    except (SyntaxError, ValueError):
        return False
    if body and _docstring(body[0]):
        body = body[1:]
    alls = [node for node in body if _all_literal(node)]
    rest = [node for node in body if not _all_literal(node)]
    return len(alls) <= 1 and all(_own_import(node, package) for node in rest)
