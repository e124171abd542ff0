"""Source rules on names: what a name *is*, and writes to what the stage does not own.

``source.import`` judges module paths; a module path can be fine while the
name taken from it is not (``from torch.serialization import os``,
``torch.utils.collect_env.run``). So every imported name and every attribute
chain rooted at one is checked for what it resolves to:

- ``source.name``: a chain rooted at an allowed library is resolved in a
  fresh interpreter that imports no code of the tree (``_name_probe.py``).
  Refused: a module object met on the way that stage code may not import
  (``os``, ``sys``, ``subprocess``, ``importlib``, ``builtins``...), or one
  that runs programs, loads code or data or changes global state
  (``DENIED_MODULES``: ``torch.serialization``, ``torch.utils.collect_env``...);
  a callable defined in one of those; a function whose bytecode names a
  program or code loader (``Popen``, ``system``, ``exec``, ``import_module``...);
  a function that changes every module's or torch's behaviour (global hooks,
  default dtype or device, seeds, thread counts: ``GLOBAL_STATE``). A chain
  rooted at another stage's module may name only a public name that module
  defines itself (never one it imported, such as ``rope.torch``).
- ``source.foreign-write``: an assignment, augmented assignment or ``del`` of
  an attribute or item of something the stage does not own: a module, class
  or function bound by an import (another stage's, torch's, pytest's), a
  direct alias of one, the class of an object (``type(x).f = ...``,
  ``x.__class__.f = ...``), or ``setattr``/``delattr`` on one; and any
  assignment to an attribute named ``forward``. Instances the stage builds or
  is handed keep their own attributes writable (``module.kv_cache = cache``).
"""

from __future__ import annotations

import ast
import json
import subprocess
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Literal

import msgspec

from niels_gpt_contracts.checks.code.source import ALLOWED_IMPORTS, INTERPRETER_MODULES
from niels_gpt_contracts.decoding import Malformed, decode, last_line, one_line
from niels_gpt_contracts.rules import Rule

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
SOURCE_FOREIGN_WRITE = Rule(
    "source.foreign-write",
    "A stage module writes to something it does not own.",
    "Assigning or deleting an attribute or item of another stage's, torch's or "
    "pytest's modules, classes or functions (directly, through an alias, through "
    "type(x) or x.__class__, or with setattr/delattr), or replacing a module's forward, "
    "changes what other code computes behind its back.",
    "Subclass, wrap or pass values instead; change another stage in that stage's PR.",
)

PROBE = Path(__file__).with_name("_name_probe.py")
DENIED_MODULES = (
    "torch.serialization",
    "torch.utils.collect_env",
    "torch.utils.cpp_extension",
    "torch.utils.benchmark",
    "torch.utils.data",
    "torch.utils.tensorboard",
    "torch.utils.hooks",
    "torch.multiprocessing",
    "torch.distributed",
    "torch.package",
    "torch.hub",
    "torch.onnx",
    "torch.overrides",
    "torch.library",
    "torch.testing",
    "torch.random",
    "torch.fx",
    "torch.export",
    "torch.jit",
    "torch.nn.utils.parametrize",
)
GLOBAL_STATE = frozenset(
    {
        "set_default_dtype",
        "set_default_device",
        "set_default_tensor_type",
        "set_num_threads",
        "set_num_interop_threads",
        "manual_seed",
        "manual_seed_all",
        "seed",
        "seed_all",
        "set_rng_state",
        "set_rng_state_all",
        "fork_rng",
        "use_deterministic_algorithms",
        "set_deterministic_debug_mode",
        "set_flush_denormal",
        "set_float32_matmul_precision",
        "set_printoptions",
        "set_warn_always",
        "set_detect_anomaly",
        "set_anomaly_enabled",
    }
)
# The process-wide random generators themselves: whoever holds one can reseed or
# rewind every other user's random stream (``.set_state``, ``.manual_seed``).
GLOBAL_GENERATORS = frozenset({"default_generator", "default_generators"})
Finding = tuple[str, int, str]


def _bindings(tree: ast.Module) -> dict[str, str]:
    """Local name -> the dotted thing an import binds to it (anywhere in the module)."""
    out: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                out[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "__future__":
                continue
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def _literal_getattr(node: ast.AST) -> tuple[ast.AST, str] | None:
    """``(object, name)`` of ``getattr(object, "name"[, default])``, else ``None``."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.args[0], node.args[1].value
    return None


def _chain(node: ast.AST) -> list[str] | None:
    """Dotted parts of ``a.b.c``; a literal ``getattr(a, "b")`` reads as ``a.b``."""
    parts: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            parts.append(node.attr)
            node = node.value
        elif (got := _literal_getattr(node)) is not None:
            parts.append(got[1])
            node = got[0]
        else:
            break
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def chains(tree: ast.Module) -> list[tuple[str, int]]:
    """``(dotted, line)`` of every maximal attribute chain rooted at an imported name."""
    bound = _bindings(tree)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    inner |= {id(g[0]) for n in ast.walk(tree) if (g := _literal_getattr(n)) is not None}
    out: list[tuple[str, int]] = []
    for node in ast.walk(tree):
        chained = isinstance(node, (ast.Attribute, ast.Name)) or _literal_getattr(node)
        if id(node) in inner or not chained:
            continue
        parts = _chain(node)
        if parts and parts[0] in bound:
            out.append((".".join([bound[parts[0]], *parts[1:]]), getattr(node, "lineno", 1)))
    for node in ast.walk(tree):  # what every import statement loads, used or not
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module != "__future__":
            out += [(f"{node.module}.{a.name}", node.lineno) for a in node.names if node.module]
    return sorted(set(out), key=lambda c: (c[1], c[0]))


def _foreign(tree: ast.Module) -> set[str]:
    """Names bound by an import, and names that directly alias one (``A = attn.Cls``)."""
    names = set(_bindings(tree))
    changed = True
    while changed:
        changed = False
        for node in ast.walk(tree):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign) and _rooted(node.value, names):
                targets = list(node.targets)
            elif isinstance(node, (ast.For, ast.comprehension)) and _literal_of(node.iter, names):
                targets = [node.target]
            for t in targets:  # the names bound, never those an attribute target reads
                for n in _bound_names(t):
                    if n not in names:
                        names.add(n)
                        changed = True
    return names


def _bound_names(target: ast.AST) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [n for e in target.elts for n in _bound_names(e)]
    if isinstance(target, ast.Starred):
        return _bound_names(target.value)
    return []


def _rooted(node: ast.AST, names: set[str]) -> bool:
    """``node`` is a foreign name, an attribute or item of one, ``getattr(one, "x")``,
    or a container literal holding one."""
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "getattr"
        and node.args
    ):
        return _rooted(node.args[0], names)
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        return any(_rooted(e, names) for e in node.elts)
    if isinstance(node, ast.Dict):
        return any(v is not None and _rooted(v, names) for v in node.values)
    return isinstance(node, ast.Name) and node.id in names


def _literal_of(node: ast.AST, names: set[str]) -> bool:
    return isinstance(node, (ast.Tuple, ast.List, ast.Set, ast.Dict)) and _rooted(node, names)


def _owner_problem(target: ast.AST, foreign: set[str]) -> str | None:
    base = target.value if isinstance(target, (ast.Attribute, ast.Subscript)) else None
    if base is None:
        return None
    if isinstance(target, ast.Attribute) and target.attr == "forward":
        return f"assigns {ast.unparse(target)}: a module's behaviour is its class's forward"
    node: ast.AST = base
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        if isinstance(node, ast.Attribute) and node.attr == "__class__":
            return f"writes {ast.unparse(target)}: an attribute of an object's class"
        node = node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "type":
        return f"writes {ast.unparse(target)}: an attribute of an object's class"
    if isinstance(node, ast.Name) and node.id in foreign:
        return f"writes {ast.unparse(target)}: {node.id} is imported, not this stage's own"
    return None


def foreign_writes(tree: ast.Module) -> Iterator[Finding]:
    """``source.foreign-write`` findings: ``(rule, line, message)``."""
    foreign = _foreign(tree)
    for node in ast.walk(tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = [t for tgt in node.targets for t in ast.walk(tgt)]
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for target in targets:
            problem = _owner_problem(target, foreign)
            if problem:
                yield SOURCE_FOREIGN_WRITE.id, getattr(node, "lineno", 1), problem
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
            and node.args
        ):
            root = node.args[0]
            while isinstance(root, ast.Attribute):
                root = root.value
            if isinstance(root, ast.Name) and root.id in foreign:
                what = f"{node.func.id}({ast.unparse(node.args[0])}, ...)"
                yield (
                    SOURCE_FOREIGN_WRITE.id,
                    node.lineno,
                    f"{what}: {root.id} is not this stage's own",
                )


class Resolved(msgspec.Struct, frozen=True):
    """What the name probe found a dotted name to be (``_name_probe.resolve``).

    ``modules``: the module objects met on the way; ``defined_in``: the module
    the last object was defined in; ``markers``: names in its bytecode that
    run programs or load code; ``generator``: it is (or holds) a torch random
    generator; ``why``: why a ``missing`` name did not resolve.
    """

    kind: Literal["module", "class", "function", "other", "missing"]
    modules: tuple[str, ...]
    defined_in: str | None = None
    qualname: str | None = None
    markers: tuple[str, ...] = ()
    generator: bool = False
    why: str | None = None


MISSING = Resolved("missing", ())


def judge_resolved(dotted: str, found: Resolved) -> str | None:
    """Why a resolved library chain is refused, or ``None``."""
    for module in found.modules:
        if _module_problem(module):
            return f"{dotted} reaches the module {module}: {_module_problem(module)}"
    kind, defined = found.kind, found.defined_in
    if kind == "missing":
        return None
    # torch's own functions are defined in its private extension (torch._C): only
    # the interpreter's modules and the denied ones count for where a thing lives.
    if kind != "module" and defined is not None and _home_problem(defined):
        return f"{dotted} is defined in {defined}: {_home_problem(defined)}"
    if found.markers:
        return f"{dotted} runs programs or loads code (its code uses {', '.join(found.markers)})"
    own_name = (found.qualname or "").rsplit(".", 1)[-1]
    last = dotted.rsplit(".", 1)[-1]
    if last in GLOBAL_STATE or own_name in GLOBAL_STATE or "register_module_" in dotted:
        return f"{dotted} changes torch's global state, for every stage"
    if found.generator or GLOBAL_GENERATORS & set(dotted.split(".")):
        return f"{dotted} is a process-wide random generator: it can reseed every stage's draws"
    return None


def _home_problem(name: str) -> str | None:
    top = name.split(".")[0]
    if top in INTERPRETER_MODULES or name.startswith(DENIED_MODULES):
        return "it runs programs, loads code or data, or reaches into the interpreter"
    return None


def _module_problem(name: str) -> str | None:
    top = name.split(".")[0]
    if top in INTERPRETER_MODULES or (top.startswith("_") and top != "__future__"):
        return "it reaches into the interpreter or the test run"
    if top not in ALLOWED_IMPORTS:
        return "stage modules may not use it"
    if name.startswith(DENIED_MODULES) or any(p.startswith("_") for p in name.split(".")[1:]):
        return "it runs programs, loads code or data, or is private"
    return None


def resolve(names: list[str], python: str, env: Mapping[str, str] | None) -> dict[str, Resolved]:
    """Resolve library chains in ``python`` (no code of the tree); ``{}`` for no names.

    Raises:
        Malformed: the probe did not run, or printed no ``{name: Resolved}`` object
            (one line: "the name probe failed: <why>").
    """
    if not names:
        return {}
    try:
        done = subprocess.run(
            [python, str(PROBE)],
            input=json.dumps(sorted(set(names))),
            capture_output=True,
            text=True,
            env=None if env is None else dict(env),
            cwd=None if env is None else env.get("HOME"),
            timeout=300,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as err:
        raise Malformed(one_line(f"the name probe failed: {err}")) from None
    what = "the name probe failed: expected an object of resolved names"
    return decode(last_line(done.stdout), dict[str, Resolved], what)
