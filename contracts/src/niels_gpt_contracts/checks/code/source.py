"""Readable source: a stage's modules use no feature that hides what they run.

The name-based rules (``forbidden_name``, ``forbidden_in_function``) read
names. Code that builds a name at run time (``getattr(F, "scaled_" + ...)``,
``globals()``, ``F.__dict__[...]``) or imports a module that can reach into the
interpreter (``sys``, ``importlib``, ``gc``, ``_pytest``) would slip past them,
and could tamper with the test run it is imported into. So every stage module
is held to two rules, checked with ``ast``:

- ``source.import``: imports come from a short allowlist: the stages' shared
  namespace (``niels_gpt``; ``checks.ownership.modules`` judges which stages), ``torch``
  and its public submodules, and a few pure-computation standard modules.
- ``source.dynamic``: no ``eval``/``exec``/``compile``/``__import__``,
  ``globals``/``locals``/``vars``, ``open``, ``breakpoint``, called or passed
  as a value (``functools.reduce(getattr, ...)``); no
  ``getattr``/``setattr``/``delattr``/``hasattr`` with a computed name unless
  the object is ``self`` or ``cls``; no dunder attribute outside a small
  allowlist (``__dict__``, ``__signature__``, ``__wrapped__``, ``__code__``...);
  no attribute that names an interpreter-level module (``torch.sys``), loads
  or writes code or data (``torch.load``, ``.tofile``, ``torch.hub``,
  ``torch.ops``), or is private to torch (``torch._C``), but for the ATen ops
  ``ALLOWED_TORCH_OPS`` names, called by their literal name from ``torch``; no
  method that changes what calling or reading an object does (``__call__``,
  ``__getattr__``...): a module's behaviour is its ``forward``.

These rules cannot prove the absence of tampering (see ``contracts/SECURITY.md``);
they make it visible to a reviewer instead of leaving it to chance.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator, Mapping

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import Spec

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
SOURCE_IMPORT = Rule(
    "source.import",
    "A stage module imports outside the allowed modules.",
    "Stage code may import the stages' namespace, public torch and pure-computation "
    "standard library modules only, so what it does can be read from its source.",
    "Replace the import by one of the allowed modules.",
)

SOURCE_DYNAMIC = Rule(
    "source.dynamic",
    "A stage module builds names or code at run time.",
    "Code built at run time (eval, exec, getattr with computed names, interpreter "
    "internals) hides what runs from every static check.",
    "Write the code out so that it reads as what it does.",
)

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
    }
)
# Parts of torch that compile or load native code, or reach its dispatcher.
DENIED_TORCH = ("torch.utils.cpp_extension", "torch.hub", "torch.library", "torch.ops")
DYNAMIC_CALLS = frozenset(
    {
        *("eval", "exec", "compile", "__import__", "globals", "locals", "vars", "open"),
        *("breakpoint", "input", "exit", "quit", "help"),
    }
)
NAME_CALLS = frozenset({"getattr", "setattr", "delattr", "hasattr"})
ALLOWED_DUNDERS = frozenset(
    {"__init__", "__class__", "__name__", "__qualname__", "__doc__", "__module__"}
)
# Where the module was loaded from is how code tells a test run from a user's:
# __file__ and its kin are not for stage modules either.
DENIED_NAMES = frozenset(
    {"__builtins__", "__loader__", "__spec__", "__import__", "__file__", "__path__", "__cached__"}
)
# Attributes that load or write code or data, reach the dispatcher, or bypass
# nn.Module's call path; whatever object they hang on.
DENIED_ATTRIBUTES = frozenset(
    {
        "load",
        "save",
        "tofile",
        "fromfile",
        "from_file",
        "numpy",
        "hub",
        "package",
        "library",
        "ops",
        "jit",
        "filters",
        "_call_impl",
        "_wrapped_call_impl",
        # frames, tracebacks, generators and code: the way up to the caller's globals
        *("f_back", "f_globals", "f_locals", "f_builtins", "f_code", "tb_frame", "tb_next"),
        *("gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "ag_code"),
        *("co_code", "co_consts", "co_names", "func_globals"),
    }
)
# ATen ops a stage may call by their literal dotted name from ``torch`` (the
# dispatcher, ``torch.ops``, and torch's private names are otherwise denied):
# each names one kernel, so the call reads as what it runs, and each is here
# for a spec that says why.
ALLOWED_TORCH_OPS = frozenset(
    {
        # quant 3.0 (issue 49): the fused weight-only int8 kernel, which has no public name
        "torch.ops.aten._weight_int8pack_mm",
    }
)
# Methods whose definition changes what calling or reading an object does.
DENIED_DEFINITIONS = frozenset(
    {
        "__call__",
        "__getattr__",
        "__getattribute__",
        "__setattr__",
        "__delattr__",
        "__init_subclass__",
        "__set_name__",
        "__class_getitem__",
        "__instancecheck__",
        "__subclasscheck__",
    }
)
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


def _dynamic_problem(node: ast.AST, callees: set[int], torch_names: set[str]) -> str | None:
    if (
        isinstance(node, ast.Name)
        and node.id in DYNAMIC_CALLS | NAME_CALLS
        and id(node) not in callees
    ):
        return f"passes {node.id} as a value: it can build names or code out of sight"
    if (
        isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        and node.name in DENIED_DEFINITIONS
    ):
        return f"defines {node.name}: it changes what calling or reading the object does"
    if (
        isinstance(node, ast.Attribute)
        and node.attr.startswith("_")
        and not node.attr.startswith("__")
    ):
        root = node.value
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and root.id in torch_names:
            return f"uses {ast.unparse(node)}: private parts of torch are not for stage modules"
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
    if attr in DENIED_ATTRIBUTES:
        return f"uses the attribute .{attr}: it loads or writes code or data, or bypasses forward"
    return None


def _torch_names(tree: ast.Module) -> set[str]:
    """Names bound to torch or a part of it (``import torch.nn.functional as F``)."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.split(".")[0] == "torch":
                    names.add(a.asname or "torch")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names.update(a.asname or a.name for a in node.names)
    return names


def _allowed_ops(tree: ast.Module) -> set[int]:
    """Ids of the nodes that spell an ``ALLOWED_TORCH_OPS`` name, ``torch`` itself included
    (only the literal chain from the name ``torch``, not an alias of it)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and ast.unparse(node) in ALLOWED_TORCH_OPS:
            part: ast.expr = node
            while isinstance(part, ast.Attribute):
                out.add(id(part))
                part = part.value
            out.add(id(part))
    return out


def _findings(tree: ast.Module, shared: set[str]) -> Iterator[tuple[str, int, str]]:
    callees = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    torch_names = _torch_names(tree)
    allowed = _allowed_ops(tree)
    for node in ast.walk(tree):
        for name in _imports(node):
            problem = _import_problem(name, shared)
            if problem:
                yield SOURCE_IMPORT.id, getattr(node, "lineno", 1), problem
        if id(node) in allowed:
            continue
        problem = _dynamic_problem(node, callees, torch_names)
        if problem:
            yield SOURCE_DYNAMIC.id, getattr(node, "lineno", 1), problem


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
                    SOURCE_DYNAMIC.id,
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
