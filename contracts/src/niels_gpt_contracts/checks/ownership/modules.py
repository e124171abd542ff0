"""Module ownership: a stage owns exactly the modules its spec lists.

Three rules, read from the tree with ``ast`` (nothing is imported):

- ``module.unlisted``: a file under the stage's ``src/`` that its spec does not
  list (a helper module, a ``.pth`` file, an ``__init__.py``). A ``py.typed``
  marker (PEP 561), in any folder, is the one file every package may add.
- ``module.shadowed``: such a file is imported under the name of a module a
  stage owns (``packages/attention/src/niels_gpt/model/rope.py``, or
  ``.../rope/__init__.py`` where rope owns ``rope.py``): on a shared import path
  it would replace that stage's code.
- ``module.undeclared-import``: a stage module imports a ``niels_gpt`` module
  owned by a stage outside its ``depends_on`` closure (or by no stage), lazily
  inside a function or not. An optional import of a later stage would let a
  stage run code its spec never vetted.
- ``module.missing``: a listed module is absent.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import Spec, import_name

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
MODULE_UNLISTED = Rule(
    "module.unlisted",
    "A file under the stage's src/ is not a module its spec lists.",
    "A stage owns exactly the modules its spec lists; an unlisted file would ship "
    "code nothing judges.",
    "Remove the file, or list the module in the spec (a maintainer change).",
)

MODULE_SHADOWED = Rule(
    "module.shadowed",
    "A stage file sits at the path of another stage's module.",
    "Two distributions must never own the same file: one would overwrite or shadow "
    "the other when both are installed.",
    "Move the code into a module the stage owns.",
)

MODULE_MISSING = Rule(
    "module.missing",
    "A module the stage's spec lists is absent.",
    "Every module the spec lists must exist under the stage's src/.",
    "Restore the module at the path the spec lists.",
)

MODULE_UNDECLARED_IMPORT = Rule(
    "module.undeclared-import",
    "A stage module imports a stage it does not depend on.",
    "A stage may import only the stages in its depends_on (and their own dependencies), "
    "so that installing one stage brings everything it needs and nothing more.",
    "Drop the import, or declare the dependency in the spec (a maintainer change).",
)

ALWAYS_ALLOWED = ("py.typed",)


def dependency_closure(spec: Spec, specs: Mapping[str, Spec]) -> set[str]:
    """The stage and every stage it depends on, transitively."""
    seen: set[str] = set()
    todo = [spec.id]
    while todo:
        stage = todo.pop()
        if stage in seen or stage not in specs:
            continue
        seen.add(stage)
        todo.extend(specs[stage].depends_on)
    return seen


def owners(specs: Mapping[str, Spec]) -> dict[str, str]:
    """Module path below ``src/`` (``niels_gpt/model/rope.py``) -> owning stage."""
    return {m: s.id for s in specs.values() for m in s.modules}


def namespaces(specs: Mapping[str, Spec]) -> set[str]:
    """The top-level packages the stages share (``niels_gpt``)."""
    return {m.split("/", 1)[0].removesuffix(".py") for s in specs.values() for m in s.modules}


def _imported_modules(node: ast.AST, module_path: str) -> list[tuple[int, str]]:
    """``(line, dotted name)`` of every module an import statement may load."""
    if isinstance(node, ast.Import):
        return [(node.lineno, a.name) for a in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:
        package = module_path.removesuffix(".py").split("/")[: -node.level]
        base = ".".join([*package, *([node.module] if node.module else [])])
    else:
        base = node.module or ""
    # ``from a.b import c`` loads a.b and, when c is a submodule, a.b.c.
    return [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]


def _target(name: str, owned: Mapping[str, str]) -> str | None:
    """The owned module file a dotted import resolves to, if any: ``name.py`` or, for
    a module that is a package of its own (PEP 561 per stage), ``name/__init__.py``."""
    for path in (name.replace(".", "/") + ".py", name.replace(".", "/") + "/__init__.py"):
        if path in owned:
            return path
    return None


def check_imports(
    spec: Spec, specs: Mapping[str, Spec], texts: Mapping[str, str | None]
) -> list[Violation]:
    """``module.undeclared-import`` for the stage's own modules (texts by repo path)."""
    owned = owners(specs)
    shared = namespaces(specs)
    packages = {
        ".".join(m.split("/")[:i]) for m in owned for i in range(1, m.count("/") + 1)
    }  # niels_gpt, niels_gpt.model: the namespace packages the modules live in
    allowed = dependency_closure(spec, specs)
    out: list[Violation] = []
    for module in spec.modules:
        path = f"{spec.src}/{module}"
        text = texts.get(path)
        if text is None:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue  # the static and API checks report unparsable source
        for node in ast.walk(tree):
            for line, name in _imported_modules(node, module):
                if name.split(".", 1)[0] not in shared:
                    continue
                target = _target(name, owned)
                if target is None:
                    if name in packages or _target(name.rsplit(".", 1)[0], owned):
                        continue  # a namespace package, or a name taken from a module
                    message = f"imports {name}, a module no stage owns"
                elif owned[target] in allowed:
                    continue
                else:
                    message = (
                        f"imports {name}, owned by stage {owned[target]!r}, which "
                        f"{spec.id!r} does not depend on (depends_on: "
                        f"{', '.join(sorted(allowed - {spec.id})) or 'nothing'})"
                    )
                out.append(
                    Violation(MODULE_UNDECLARED_IMPORT.id, path, line, message, spec.id, "modules")
                )
    return out


def check_modules(spec: Spec, specs: Mapping[str, Spec], tree: Tree) -> list[Violation]:
    """Every ownership violation of ``spec`` on ``tree``."""
    owned = owners(specs)
    # One import name, two possible files (rope.py, rope/__init__.py): either shadows.
    by_name = {import_name(m): (m, stage) for m, stage in owned.items()}
    prefix = spec.src + "/"
    out: list[Violation] = []
    present = {f for f in tree.files() if f.startswith(prefix)}
    for path in sorted(present):
        module = path.removeprefix(prefix)
        if module in spec.modules or module.rsplit("/", 1)[-1] in ALWAYS_ALLOWED:
            continue
        if module.endswith(".py") and import_name(module) in by_name:
            module, stage = by_name[import_name(module)]
            out.append(
                Violation(
                    MODULE_SHADOWED.id,
                    path,
                    None,
                    f"shadows {module}, which stage {stage!r} owns: on one import "
                    "path this file would replace that stage's module",
                    spec.id,
                    "modules",
                    changed=True,
                )
            )
        else:
            out.append(
                Violation(
                    MODULE_UNLISTED.id,
                    path,
                    None,
                    f"{module} is not among the modules stage {spec.id!r} owns "
                    f"({', '.join(spec.modules)}); a stage ships exactly what its spec lists",
                    spec.id,
                    "modules",
                    changed=True,
                )
            )
    for module in spec.modules:
        if f"{prefix}{module}" not in present:
            out.append(
                Violation(
                    MODULE_MISSING.id,
                    spec.path,
                    None,
                    f"the spec lists {module}, found no {prefix}{module}",
                    spec.id,
                    "modules",
                )
            )
    out += check_imports(spec, specs, tree.read_many(f"{prefix}{m}" for m in spec.modules))
    return out
