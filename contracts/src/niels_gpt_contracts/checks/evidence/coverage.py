"""Domain coverage of an oracle driver, read from source with ``ast`` (``oracle.coverage``).

A spec's ``[oracle]`` table may name ``axes``: the parts of the stage's
domain its driver must sweep (``magnitude``, ``dtype``, ``layout``,
``config``, ``modes``, ``grad2``, ``history``, ``errors``, ``combos``, ``size``; see
specs/spec.schema.json). A driver marks the calls that sweep an axis with
``o.call(..., axes=("magnitude", ...))``. This check reads the driver file
and every other ``.py`` file beside it under ``specs/<stage>/`` (the modules
a driver imports; the stage's ``tests/`` excluded) and every spec kit
file the spec declares or reaches through the kit's imports
(``checks.context.speckit``: the oracle sweeps), collects the
string literals given as ``axes=`` to any ``.call(...)``, and names each
declared axis none of them carries. Nothing is imported or run.

Only literals count: a tuple, list or set of strings, or one string
(``axes="grad2"``), or a module-level name bound once to such a literal
(``GRAD2 = ("grad2",)`` then ``axes=GRAD2``). An axis reached any other way
(built at run time) is not seen, so the spec is refused: the check fails
closed. A file that does not parse is a violation too.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable

from niels_gpt_contracts.checks.context import speckit
from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import SPECS_DIR, Spec

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
ORACLE_COVERAGE = Rule(
    "oracle.coverage",
    "A domain axis the spec declares is never swept by its oracle driver.",
    "A spec's [oracle] axes name the parts of the stage's domain the oracle must draw "
    "from (magnitude, dtype, layout, config, modes, grad2, history, errors, combos, size). "
    "A driver that never tags a call with one of them leaves that part of the contract "
    "unjudged, so the spec is refused until it does.",
    'Add calls tagged axes=("<axis>",) to the stage\'s driver, or amend the spec.',
)

CHECK = "coverage"


def _strings(node: ast.AST, names: dict[str, ast.AST]) -> set[str] | None:
    """The strings of a literal (``"a"``, ``("a", "b")``, a module name for one); ``None``
    when ``node`` is not such a literal."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        out: set[str] = set()
        for item in node.elts:
            if not (isinstance(item, ast.Constant) and isinstance(item.value, str)):
                return None
            out.add(item.value)
        return out
    if isinstance(node, ast.Name) and node.id in names:
        return _strings(names[node.id], {})
    return None


def _module_names(mod: ast.Module) -> dict[str, ast.AST]:
    """Module-level names bound exactly once by a plain assignment, to their value."""
    bound: dict[str, list[ast.AST]] = {}
    for stmt in mod.body:
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Name):
                    bound.setdefault(target.id, []).append(stmt.value)
        elif (
            isinstance(stmt, ast.AnnAssign)
            and isinstance(stmt.target, ast.Name)
            and stmt.value is not None
        ):
            bound.setdefault(stmt.target.id, []).append(stmt.value)
    return {name: values[0] for name, values in bound.items() if len(values) == 1}


def swept_axes(source: str) -> set[str]:
    """Every axis named as a literal in ``axes=`` of a ``.call(...)`` in ``source``.

    Raises:
        SyntaxError: ``source`` does not parse.
    """
    mod = ast.parse(source)
    names = _module_names(mod)
    found: set[str] = set()
    for node in ast.walk(mod):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        if node.func.attr != "call":
            continue
        for kw in node.keywords:
            if kw.arg == "axes":
                found |= _strings(kw.value, names) or set()
    return found


def driver_files(spec: Spec, files: Iterable[str]) -> list[str]:
    """The driver file and the ``.py`` files beside it under ``specs/<stage>/`` (no tests)."""
    assert spec.oracle is not None
    own = f"{SPECS_DIR}/{spec.id}/"
    beside = {
        f
        for f in files
        if f.startswith(own) and f.endswith(".py") and "/tests/" not in f[len(own) - 1 :]
    }
    return sorted(beside | {spec.oracle.driver_file})


def check_coverage(spec: Spec, tree: Tree) -> list[Violation]:
    """``oracle.coverage`` for each declared axis no driver call of ``spec`` sweeps."""
    if spec.oracle is None or not spec.oracle.axes:
        return []
    files = driver_files(spec, tree.files())
    texts = dict(tree.read_many(files))
    kit = speckit.kit_texts(tree.files(), tree.read_many)
    for path in speckit.files_used(speckit.declared(spec), kit):  # the kit's sweeps count
        if path.endswith(".py"):  # where the spec declares them
            texts[path] = kit[path]
    found: list[Violation] = []
    swept: set[str] = set()
    for path, text in texts.items():
        if text is None:
            if path == spec.oracle.driver_file:
                why = f"{spec.id}: the oracle driver {path} is missing"
                found.append(Violation(ORACLE_COVERAGE.id, path, None, why, spec.id, CHECK))
            continue
        try:
            swept |= swept_axes(text)
        except SyntaxError as err:
            why = f"{spec.id}: cannot parse {path} (line {err.lineno})"
            found.append(Violation(ORACLE_COVERAGE.id, path, err.lineno, why, spec.id, CHECK))
    for axis in spec.oracle.axes:
        if axis not in swept:
            why = (
                f"{spec.id}: the declared domain axis '{axis}' is never swept: no call of the "
                f"oracle driver passes it in axes="
            )
            found.append(Violation(ORACLE_COVERAGE.id, spec.path, None, why, spec.id, CHECK))
    return found


def summary(spec: Spec) -> str:
    """The KEPT row's text."""
    axes = spec.oracle.axes if spec.oracle else ()
    return f"{len(axes)} declared domain axes swept" if axes else "no domain axes declared"
