"""The maintainers' spec kit: which stages use each of its files, from their declarations.

``specs/_kit/speckit/`` is a package of spec-side helpers several stages
share (its own docstring says how drivers and tests reach it). A spec names
the kit modules its spec-side files import: ``[oracle] kit = ["sweeps"]``
means ``speckit/sweeps.py``. A kit file is evidence of its *users*:

- a module's users are the stages whose declared modules reach it through
  the kit's own import statements (``module_sweeps`` imports ``sweeps``, so a
  stage declaring the first uses the second); the package's ``__init__.py``
  and any file that is not a module of it (a data table) are used by every
  stage that declares a module;
- an amendment that changes a kit file must name each user, in the base or
  in the head, with a ``Spec:`` trailer, and the change is classified for
  each like an edit of its own evidence (``verdict.amendment``);
- a verdict writes the kit files its stages use beside the base's acceptance
  tests (``verdict.plan``) and drivers (``verdict.files``, ``verdict.oracle``);
- a user reaches the stages the kit files it uses import (``checks.context.importers``).

The declaration cannot lie: a spec-side file (anything under
``specs/<stage>/``) whose import statements name a kit module its spec does
not declare is refused (``speckit.undeclared``). Imports are read with
``ast``; nothing is imported or run, and no text is searched.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import KIT_DIR, KIT_PACKAGE, SPECS_DIR, Spec

# The rule this module emits, with what SARIF shows of it; defining it registers it
# (``rules.registry``).
SPECKIT_UNDECLARED = Rule(
    "speckit.undeclared",
    "A spec-side file imports a kit module its spec does not declare.",
    "A stage's spec names the spec kit modules its drivers and tests import "
    "([oracle] kit). Those declarations decide who must be named when a kit file "
    "changes, so an import the spec does not declare would let a kit edit escape "
    "a stage it changes.",
    "Add the module to the spec's [oracle] kit, or drop the import.",
)

CHECK = "speckit"
PACKAGE_DIR = f"{KIT_DIR}/{KIT_PACKAGE}/"


def in_kit(path: str) -> bool:
    """Whether a repository path is a file of the kit."""
    return path.startswith(f"{KIT_DIR}/")


def module_of(path: str) -> str | None:
    """``specs/_kit/speckit/sweeps.py`` -> ``sweeps``; ``None`` for any other kit file
    (the package's ``__init__.py``, a data table): those serve every user."""
    rest = path.removeprefix(PACKAGE_DIR)
    if rest == path or "/" in rest or not rest.endswith(".py") or rest == "__init__.py":
        return None
    return rest.removesuffix(".py")


def imports(source: str, inside_kit: bool = False) -> Iterator[tuple[str, int]]:
    """``(kit module, line)`` for each kit module an import statement of ``source`` names:
    ``import speckit.x``, ``from speckit import x``, ``from speckit.x import f``, and in
    a kit file (``inside_kit``) ``from . import x`` and ``from .x import f``.

    Raises:
        SyntaxError: ``source`` does not parse.
    """
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                head, _, rest = alias.name.partition(".")
                if head == KIT_PACKAGE and rest:
                    yield rest.split(".")[0], node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module is not None:
                head, _, rest = node.module.partition(".")
                if head != KIT_PACKAGE:
                    continue
            elif node.level == 1 and inside_kit:
                rest = node.module or ""
            else:
                continue
            if rest:
                yield rest.split(".")[0], node.lineno
            else:
                yield from ((alias.name, node.lineno) for alias in node.names)


def _kit_imports(text: str | None) -> set[str]:
    try:
        return {m for m, _ in imports(text or "", inside_kit=True)}
    except SyntaxError:
        return set()  # the amendment and the coverage check say so; nothing is reached


def reach(modules: Iterable[str], kit: Mapping[str, str | None]) -> set[str]:
    """``modules`` and the kit modules they import in turn (``kit``: path -> text)."""
    texts = {m: text for path, text in kit.items() if (m := module_of(path)) is not None}
    seen, todo = set(modules), list(modules)
    while todo:
        for nxt in _kit_imports(texts.get(todo.pop())) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def files_used(declared: Iterable[str], kit: Mapping[str, str | None]) -> list[str]:
    """The kit files (among ``kit``'s paths) that a declaration of ``declared`` uses, sorted."""
    wanted = reach(declared, kit)
    if not wanted:
        return []
    return sorted(p for p in kit if (m := module_of(p)) is None or m in wanted)


def declared(spec: Spec) -> tuple[str, ...]:
    """The kit modules ``spec`` declares (``[oracle] kit``)."""
    return spec.oracle.kit if spec.oracle is not None else ()


def declared_in(data: Mapping[str, Any]) -> tuple[str, ...]:
    """The same read from a spec's raw TOML table, leniently (an unvalidated head)."""
    oracle = data.get("oracle")
    kit = oracle.get("kit", []) if isinstance(oracle, Mapping) else []
    return tuple(str(m) for m in kit) if isinstance(kit, list) else ()


def users(
    declarations: Mapping[str, Iterable[str]], kit_file: str, kit: Mapping[str, str | None]
) -> set[str]:
    """The stages (``declarations``: stage -> declared modules) that use ``kit_file``."""
    if not in_kit(kit_file):
        return set()
    return {stage for stage, mods in declarations.items() if kit_file in files_used(mods, kit)}


def kit_texts(files: Iterable[str], read: Any) -> dict[str, str | None]:
    """Every kit file among ``files``, read with ``read`` (a tree's ``read_many``)."""
    return dict(read(sorted(f for f in files if in_kit(f))))


def undeclared(spec: Spec, texts: Mapping[str, str | None]) -> list[Violation]:
    """``speckit.undeclared`` for each import of a kit module that ``spec`` does not
    declare, in its spec-side Python files among ``texts`` (path -> text)."""
    own = f"{SPECS_DIR}/{spec.id}/"
    allowed = set(declared(spec))
    found: list[Violation] = []
    for path, text in sorted(texts.items()):
        if not (path.startswith(own) and path.endswith(".py")) or text is None:
            continue
        try:
            named = list(imports(text))
        except SyntaxError:
            continue  # a driver that does not parse is refused where it is run
        for module, line in named:
            if module not in allowed:
                why = (
                    f"{spec.id}: {path} imports the kit module {module!r}, expected it in "
                    f"[oracle] kit of {spec.path} (declared: {sorted(allowed) or 'none'})"
                )
                found.append(Violation(SPECKIT_UNDECLARED.id, path, line, why, spec.id, CHECK))
    return found
