"""Name probe, run in a fresh interpreter by ``checks.code.names`` (never imported by the checker).

stdin carries a JSON list of dotted names (``torch.utils.collect_env.run``),
each rooted at an allowed top-level module (never a stage's: no code of the
tree under check is imported here, only the installed libraries). Each is
resolved the way Python would at run time (attribute by attribute, importing
a submodule where the attribute is not set yet) and described: the module
objects met on the way, what the last object is, the module it was defined
in, and the markers of running programs or loading code found in its
bytecode (its own and its nested functions'). One JSON object is printed.
"""

from __future__ import annotations

import importlib
import json
import sys
import types
from typing import Any

# Names whose presence in a function's bytecode means it runs programs or loads code.
MARKERS = frozenset(
    {
        "Popen",
        "system",
        "popen",
        "execv",
        "execve",
        "execvp",
        "execl",
        "spawnv",
        "posix_spawn",
        "fork",
        "import_module",
        "__import__",
        "exec",
        "eval",
        "CDLL",
        "dlopen",
        "load_library",
        "run_path",
        "run_module",
        "check_output",
        "getoutput",
    }
)


def _names(code: types.CodeType) -> set[str]:
    found = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            found |= _names(const)
    return found


def _generator(obj: Any) -> bool:
    """``obj`` is a torch random generator, or a list or tuple holding one."""
    items = list(obj) if isinstance(obj, (list, tuple)) else [obj]
    return any(
        type(x).__name__ == "Generator" and str(type(x).__module__).split(".")[0] == "torch"
        for x in items
    )


def _describe(obj: Any) -> dict[str, Any]:
    kind = (
        "module"
        if isinstance(obj, types.ModuleType)
        else "class"
        if isinstance(obj, type)
        else "function"
        if callable(obj)
        else "other"
    )
    defined = getattr(obj, "__name__", None) if kind == "module" else None
    if defined is None:
        owner = getattr(obj, "__module__", None)
        if owner is None and isinstance(obj, types.BuiltinFunctionType):
            owner = getattr(getattr(obj, "__self__", None), "__name__", None)
        defined = owner if isinstance(owner, str) else None
    code = getattr(getattr(obj, "__func__", obj), "__code__", None)
    markers = sorted(_names(code) & MARKERS) if isinstance(code, types.CodeType) else []
    qualname = getattr(obj, "__qualname__", None)
    return {
        "kind": kind,
        "defined_in": defined,
        "qualname": qualname if isinstance(qualname, str) else None,
        "markers": markers,
        "generator": _generator(obj),  # a live one, reached through a module: global
    }


def resolve(dotted: str) -> dict[str, Any]:
    parts = dotted.split(".")
    try:
        obj: Any = importlib.import_module(parts[0])
    except BaseException as err:  # any failure: it does not resolve
        return {"kind": "missing", "why": f"{type(err).__name__}", "modules": []}
    modules = [parts[0]]
    for i, part in enumerate(parts[1:], start=1):
        if hasattr(obj, part):
            obj = getattr(obj, part)
        elif isinstance(obj, types.ModuleType):
            try:
                obj = importlib.import_module(".".join(parts[: i + 1]))
            except BaseException:
                return {"kind": "missing", "why": f"no {part}", "modules": modules}
        else:
            return {"kind": "missing", "why": f"no {part}", "modules": modules}
        if isinstance(obj, types.ModuleType):
            modules.append(obj.__name__)
    return {**_describe(obj), "modules": modules}


def main() -> None:
    names = json.loads(sys.stdin.read())
    out = {name: resolve(name) for name in names}
    sys.stdout.write("\n" + json.dumps(out) + "\n")


if __name__ == "__main__":
    main()
