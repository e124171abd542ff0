"""``source.name`` and ``source.foreign-write`` for one stage (see ``names``).

Chains rooted at the stages' shared namespace are judged from the tree's
text: the stage's own modules may be reached freely; another stage's module
only for a public name it defines itself (a ``def``, a ``class`` or an
assignment; not a name it imported, not a private one). Chains rooted at a
library are resolved by ``names.resolve`` in the interpreter given (the
sandbox's in a PR verdict); without one (``--no-api``) they are left to
``source.import``.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from niels_gpt_contracts.checks.code import names
from niels_gpt_contracts.checks.code.source import ALLOWED_IMPORTS
from niels_gpt_contracts.decoding import Malformed
from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import Spec

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
SOURCE_NAME = Rule(
    "source.name",
    "A stage module uses a name that is, or reaches, something it may not.",
    "Imported names and attribute chains are checked for what they are, resolved in "
    "an interpreter that imports no code of the PR: a module object such as os, sys, "
    "subprocess or importlib, a function that runs programs or loads code "
    "(torch.utils.collect_env.run), one that changes torch's global state (global "
    "module hooks, seeds, default dtype), or a name another stage's module does not "
    "define or export, whichever allowed module the name is taken from.",
    "Compute with torch's tensor API and the stages' exported names only.",
)

Interpreter = tuple[str, Mapping[str, str] | None]


def _defined(text: str | None) -> set[str] | None:
    """Public names a module defines itself or lists in ``__all__`` (``None``: unreadable).

    A name bound by ``import x`` (a module object) is never among them.
    """
    if text is None:
        return None
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return None
    out: set[str] = set()
    listed: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            out.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
            out |= names
            if "__all__" in names and node.value is not None:
                listed |= {
                    c.value
                    for c in ast.walk(node.value)
                    if isinstance(c, ast.Constant) and isinstance(c.value, str)
                }
    modules = {
        a.asname or a.name.split(".")[0]
        for node in tree.body
        if isinstance(node, ast.Import)
        for a in node.names
    }
    return {n for n in out | listed if not n.startswith("_") and n not in modules}


def _stage_chain(dotted: str, spec: Spec, specs: Mapping[str, Spec], tree: Tree) -> str | None:
    """Why a chain through the shared namespace is refused, or ``None``."""
    modules = {f"{s.src}/{m}": s.id for s in specs.values() for m in s.modules}
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        stem = "/".join(parts[:cut])
        for path, owner in modules.items():
            if path.endswith((f"/src/{stem}.py", f"/src/{stem}/__init__.py")):
                if owner == spec.id or cut == len(parts):
                    return None
                name = parts[cut]
                public = _defined(tree.read(path))
                if public is None or name not in public:
                    return (
                        f"{dotted}: {'.'.join(parts[:cut])} belongs to the {owner} stage, "
                        f"which neither defines nor exports a public {name!r}"
                    )
                return None
    return None


def check_names(
    spec: Spec,
    specs: Mapping[str, Spec],
    tree: Tree,
    shared: set[str],
    interpreter: Interpreter | None,
    *,
    static: bool = True,
    check: str = "source",
) -> list[Violation]:
    """Both rules on the stage's modules; library chains resolved in ``interpreter``.

    ``static=False`` gives only what needs the interpreter (library chains), as
    ``contracts pr`` does in its ``names`` row once the sandbox exists, after the
    ``source`` row gave the rest; ``check`` is the row the violations belong to.
    """
    found: list[Violation] = []
    pending: dict[str, list[tuple[str, int]]] = {}
    for path, text in tree.read_many(spec.module_files).items():
        if text is None:
            continue
        try:
            module = ast.parse(text)
        except SyntaxError:
            continue  # source.dynamic already names it
        for rule, line, message in names.foreign_writes(module) if static else ():
            found.append(Violation(rule, path, line, message, spec.id, check))
        for dotted, line in names.chains(module):
            if dotted.split(".")[0] in shared:
                why = _stage_chain(dotted, spec, specs, tree) if static else None
                if why:
                    found.append(Violation(SOURCE_NAME.id, path, line, why, spec.id, check))
            elif dotted.split(".")[0] in ALLOWED_IMPORTS:
                pending.setdefault(dotted, []).append((path, line))
    if interpreter is None or not pending:
        return found
    try:
        resolved = names.resolve(list(pending), *interpreter)
    except Malformed as err:
        path, line = next(iter(pending.values()))[0]
        why = f"names could not be resolved: {err}"
        return [*found, Violation(SOURCE_NAME.id, path, line, why, spec.id, check)]
    for dotted, places in sorted(pending.items()):
        why = names.judge_resolved(dotted, resolved.get(dotted, names.MISSING))
        if why:
            for path, line in places:
                found.append(Violation(SOURCE_NAME.id, path, line, why, spec.id, check))
    return found
