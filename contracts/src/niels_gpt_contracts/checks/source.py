"""Readable source: a stage's modules use no feature that hides what they run.

The name-based rules (``forbidden_name``, ``forbidden_in_function``) read
names. Code that builds a name at run time (``getattr(F, "scaled_" + ...)``,
``globals()``, ``F.__dict__[...]``) or imports a module that can reach into the
interpreter (``sys``, ``importlib``, ``gc``, ``_pytest``) would slip past them,
and could tamper with the test run it is imported into. So every stage module
is held to two rules, checked with ``ast``:

- ``source.import``: imports come from a short allowlist: the stages' shared
  namespace (``niels_gpt``; ``checks.modules`` judges which stages), ``torch``
  and its public submodules, and a few pure-computation standard modules.
- ``source.dynamic``: no ``eval``/``exec``/``compile``/``__import__``,
  ``globals``/``locals``/``vars``, ``open``, ``breakpoint``; no
  ``getattr``/``setattr``/``delattr``/``hasattr`` with a computed name unless
  the object is ``self`` or ``cls``; no dunder attribute outside a small
  allowlist (``__dict__``, ``__signature__``, ``__wrapped__``, ``__code__``...);
  no attribute that names an interpreter-level module (``torch.sys``).

These rules cannot prove the absence of tampering (see ``contracts/SECURITY.md``);
they make it visible to a reviewer instead of leaving it to chance.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.spec import Spec

ALLOWED_IMPORTS = frozenset(
    {
        "__future__",
        "abc",
        "collections",
        "contextlib",
        "dataclasses",
        "enum",
        "functools",
        "itertools",
        "math",
        "numbers",
        "torch",
        "typing",
        "warnings",
    }
)
# Parts of torch that compile or load native code, or reach its dispatcher.
DENIED_TORCH = ("torch.utils.cpp_extension", "torch.hub", "torch.library", "torch.ops")
DYNAMIC_CALLS = frozenset(
    {"eval", "exec", "compile", "__import__", "globals", "locals", "vars", "open", "breakpoint"}
)
NAME_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
ALLOWED_DUNDERS = frozenset(
    {"__init__", "__class__", "__name__", "__qualname__", "__doc__", "__module__"}
)
DENIED_NAMES = frozenset({"__builtins__", "__loader__", "__spec__", "__import__"})
INTERPRETER_MODULES = frozenset(
    {
        "sys",
        "os",
        "builtins",
        "subprocess",
        "ctypes",
        "gc",
        "importlib",
        "atexit",
        "inspect",
        "pickle",
        "marshal",
        "shutil",
        "socket",
        "pathlib",
        "threading",
        "multiprocessing",
        "signal",
        "runpy",
        "pytest",
        "_pytest",
        "pluggy",
    }
)


def _private(name: str) -> bool:
    return any(part.startswith("_") for part in name.split(".")[1:])


def _import_problem(name: str, shared: set[str]) -> str | None:
    top = name.split(".")[0]
    if top not in ALLOWED_IMPORTS and top not in shared:
        allowed = ", ".join(sorted(ALLOWED_IMPORTS | shared))
        return f"imports {name}: stage modules import only from {allowed}"
    if top == "torch" and (_private(name) or name.startswith(DENIED_TORCH)):
        return f"imports {name}: private or native-code parts of torch are not for stage modules"
    return None


def _imports(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Import):
        return [a.name for a in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        # ``from torch.utils import cpp_extension`` reaches torch.utils.cpp_extension.
        return [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
    return []


def _dynamic_problem(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
        name = node.func.id
        if name in DYNAMIC_CALLS:
            return f"calls {name}(): code or names built at run time cannot be reviewed"
        if name in NAME_CALLS and len(node.args) >= 2:
            target, attr = node.args[0], node.args[1]
            literal = isinstance(attr, ast.Constant) and isinstance(attr.value, str)
            own = isinstance(target, ast.Name) and target.id in ("self", "cls")
            if not literal and not own:
                return (
                    f"{name}() with a computed attribute name on {ast.unparse(target)}: "
                    "name the attribute literally"
                )
            if literal and isinstance(attr, ast.Constant):
                return _attr_problem(str(attr.value))
    if isinstance(node, ast.Attribute):
        return _attr_problem(node.attr)
    if isinstance(node, ast.Name) and node.id in DENIED_NAMES:
        return f"uses {node.id}: it reaches the interpreter's internals"
    return None


def _attr_problem(attr: str) -> str | None:
    if attr.startswith("__") and attr.endswith("__") and attr not in ALLOWED_DUNDERS:
        return f"uses the attribute {attr}: it reads or rewrites an object's internals"
    if attr in INTERPRETER_MODULES:
        return f"uses the attribute .{attr}: it reaches an interpreter-level module"
    return None


def _findings(tree: ast.Module, shared: set[str]) -> Iterator[tuple[str, int, str]]:
    for node in ast.walk(tree):
        for name in _imports(node):
            problem = _import_problem(name, shared)
            if problem:
                yield "source.import", getattr(node, "lineno", 1), problem
        problem = _dynamic_problem(node)
        if problem:
            yield "source.dynamic", getattr(node, "lineno", 1), problem


def check_source(spec: Spec, texts: Mapping[str, str | None], shared: set[str]) -> list[Violation]:
    """Both rules on the stage's own modules (``texts`` by repository path).

    ``shared`` holds the stages' namespace packages (``modules.namespaces``).
    """
    out: list[Violation] = []
    for path in spec.module_files:
        text = texts.get(path)
        if text is None:
            continue
        try:
            tree = ast.parse(text)
        except SyntaxError as err:
            out.append(
                Violation(
                    "source.dynamic",
                    path,
                    err.lineno,
                    f"cannot parse ({err.msg}), so it cannot be read",
                    spec.id,
                    "source",
                )
            )
            continue
        seen: set[tuple[str, int, str]] = set()
        for rule, line, message in _findings(tree, shared):
            if (rule, line, message) not in seen:
                seen.add((rule, line, message))
                out.append(Violation(rule, path, line, message, spec.id, "source"))
    return out
