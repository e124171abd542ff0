"""Import probe, run in a fresh interpreter by ``checks.public_api.api`` (never imported).

argv[1] is a JSON request ``{"roots": [...], "tree": "...", "entries": [...]}``.
The source roots are put first on ``sys.path`` and every other path entry that
provides one of the same top-level names is dropped, so the probe sees the
tree under check and not an installed copy. It prints one JSON object: for
each entry, what it found (kind, normalised signatures, exports, fields,
identity, and the source file and line to point at).
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import json
import os
import pkgutil
import sys
from typing import Any


def norm_expr(text: str, unquote: bool = True) -> str:
    """Canonical spelling of an expression; quoted annotations are unquoted."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
        while unquote and isinstance(node, ast.Constant) and isinstance(node.value, str):
            node = ast.parse(node.value.strip(), mode="eval").body
        return ast.unparse(node)
    except SyntaxError:
        return text.strip()


def norm_annotation(ann: Any) -> str | None:
    if ann is inspect.Parameter.empty:
        return None
    if isinstance(ann, str):
        return norm_expr(ann)
    forward = getattr(ann, "__forward_arg__", None)  # typing.ForwardRef
    if isinstance(forward, str):
        return norm_expr(forward)
    if ann is None or ann is type(None):
        return "None"
    return norm_expr(inspect.formatannotation(ann))


def norm_default(value: Any) -> str | None:
    if value is inspect.Parameter.empty:
        return None
    return norm_expr(repr(value), unquote=False)


def signature(obj: Any) -> dict[str, Any]:
    sig = inspect.signature(obj)
    return {
        "params": [
            [p.name, p.kind.name, norm_default(p.default), norm_annotation(p.annotation)]
            for p in sig.parameters.values()
        ],
        "return": norm_annotation(sig.return_annotation),
    }


def where(obj: Any, tree: str) -> tuple[str | None, int | None]:
    try:
        target = inspect.unwrap(obj)
        path = inspect.getsourcefile(target)
        line = 1 if inspect.ismodule(target) else inspect.getsourcelines(target)[1]
    except (TypeError, OSError):
        return None, None
    if path is None:
        return None, None
    rel = os.path.relpath(os.path.realpath(path), tree)
    return (rel.replace(os.sep, "/") if not rel.startswith("..") else path), line


def _in_roots(path: str, roots: list[str]) -> bool:
    real = os.path.realpath(path)
    return any(real.startswith(os.path.realpath(r) + os.sep) for r in roots)


def code_origin(
    member: Any, roots: list[str], tree: str, owner: Any = None
) -> dict[str, Any] | None:
    """Where the code that really runs was written: file, first line and name.

    Starts from the raw object (a ``staticmethod``/``classmethod`` is opened)
    and follows ``__wrapped__`` only while the code found lies outside the
    source roots (a decorator's wrapper from torch, say). An assigned
    ``__signature__`` does not move a code object, so the source found here is
    the real one. A dataclass's generated ``__init__`` points at its class,
    whose annotated fields are its source (``"dataclass": true``).
    """
    func = member.__func__ if isinstance(member, (staticmethod, classmethod)) else member
    for hops in range(8):
        code = getattr(func, "__code__", None)
        if code is not None and _in_roots(code.co_filename, roots):
            rel = os.path.relpath(os.path.realpath(code.co_filename), tree)
            return {
                "file": rel.replace(os.sep, "/"),
                "line": code.co_firstlineno,
                "name": code.co_name,
                "wrapped": hops > 0,
            }
        generated = code is not None and code.co_filename.startswith("<")
        if generated and isinstance(owner, type) and dataclasses.is_dataclass(owner):
            file, line = where(owner, tree)
            if file is not None and line is not None:
                return {"file": file, "line": line, "name": owner.__name__, "dataclass": True}
        func = getattr(func, "__wrapped__", None)
        if func is None:
            return None
    return None


def resolve(spec: str) -> Any:
    module_name, _, qualname = spec.partition(":")
    obj: Any = importlib.import_module(module_name)
    for part in filter(None, qualname.split(".")):
        obj = getattr(obj, part)
    return obj


def kind_of(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        return "class"
    if inspect.isfunction(inspect.unwrap(obj)) or inspect.isbuiltin(obj):
        return "function"
    return type(obj).__name__


def probe(entry: dict[str, Any], roots: list[str], tree: str) -> dict[str, Any]:
    out: dict[str, Any] = {"object": entry["object"]}
    module_name = entry["object"].partition(":")[0]
    try:
        module = importlib.import_module(module_name)
    except BaseException as err:  # anything an import can raise, SyntaxError included
        out["error"] = f"cannot import {module_name}: {type(err).__name__}: {err}"
        if isinstance(err, SyntaxError) and err.filename:
            rel = os.path.relpath(os.path.realpath(err.filename), tree)
            out["file"], out["line"] = rel.replace(os.sep, "/"), err.lineno
        return out
    file = os.path.realpath(getattr(module, "__file__", None) or "")
    if not any(file.startswith(os.path.realpath(r) + os.sep) for r in roots):
        out["error"] = (
            f"{module_name} resolved to {file or 'no file'}, outside the tree under "
            "check (is the module missing there?)"
        )
        return out
    try:
        obj = resolve(entry["object"])
    except AttributeError as err:
        out["error"] = f"{entry['object']} not found: {err}"
        out["file"], out["line"] = where(module, tree)
        return out
    out["kind"] = kind_of(obj)
    out["file"], out["line"] = where(obj, tree)
    if entry.get("signature"):
        try:
            out["signature"] = signature(obj)
        except (TypeError, ValueError) as err:
            out["signature_error"] = str(err)
        out["source"] = code_origin(obj, roots, tree)
    methods: dict[str, Any] = {}
    for name in entry.get("methods", []):
        member = inspect.getattr_static(obj, name, None)
        if member is None:
            methods[name] = {"error": f"no method {name!r}"}
            continue
        func = getattr(obj, name)
        try:
            methods[name] = {
                "signature": signature(func),
                "where": where(func, tree),
                "source": code_origin(member, roots, tree, obj),
            }
        except (TypeError, ValueError) as err:
            methods[name] = {"error": str(err)}
    out["methods"] = methods
    if entry.get("fields"):
        own = inspect.get_annotations(obj) if inspect.isclass(obj) else {}
        out["fields"] = {k: norm_annotation(v) for k, v in own.items()}
    if entry.get("exports"):
        exported = getattr(obj, "__all__", None)
        out["all"] = list(exported) if isinstance(exported, (list, tuple)) else None
        out["public"] = sorted(public_definitions(obj))
    if entry.get("same_as"):
        try:
            out["same"] = resolve(entry["same_as"]) is obj
        except (ImportError, AttributeError) as err:
            out["same_error"] = f"{entry['same_as']}: {type(err).__name__}: {err}"
    return out


def _defined_in(value: Any, module: str) -> bool:
    """Whether ``value`` is a class or function whose code is ``module``'s or,
    ``module`` being a package, one of its own modules'."""
    if not (inspect.isclass(value) or inspect.isfunction(inspect.unwrap(value))):
        return False
    owner = getattr(value, "__module__", None)
    return isinstance(owner, str) and (owner == module or owner.startswith(module + "."))


def public_definitions(module: Any) -> set[str]:
    """Public classes and functions a module defines, as the names to export.

    A plain module: its public names bound to its own definitions. A package
    (a stage's ``__init__.py`` re-exporting its named modules): the public names
    it binds to definitions of any of its modules, plus, for each public module
    beside its ``__init__.py`` (found on disk, not through ``__path__``, which
    the code could rebind), that module's own public definitions the package
    does not bind under the same name, as ``module.name``: reachable at their
    own import path, they are public API too. Private (``_x``) modules count
    only through what the package binds. A module that fails to import is
    reported as ``module (import failed: Error)``, so the exports check fails.
    """
    name = module.__name__
    found = {
        n for n, value in vars(module).items() if not n.startswith("_") and _defined_in(value, name)
    }
    where = getattr(module, "__file__", None)
    if not (isinstance(where, str) and os.path.basename(where) == "__init__.py"):
        return found
    for info in sorted(pkgutil.iter_modules([os.path.dirname(where)]), key=lambda i: i.name):
        if info.name.startswith("_"):
            continue
        try:
            sub = importlib.import_module(f"{name}.{info.name}")
        except Exception as err:  # a module of the stage that does not import
            found.add(f"{info.name} (import failed: {type(err).__name__})")
            continue
        for inner in public_definitions(sub):
            if "." in inner or getattr(module, inner, None) is not getattr(sub, inner, None):
                found.add(f"{info.name}.{inner}")
    return found


def main() -> None:
    request = json.loads(sys.argv[1])
    roots: list[str] = request["roots"]
    tops = {
        name.removesuffix(".py")
        for root in roots
        for name in (os.listdir(root) if os.path.isdir(root) else [])
    }

    def foreign(entry: str) -> bool:
        real = os.path.realpath(entry or ".")
        if any(real == os.path.realpath(r) for r in roots):
            return False
        return any(os.path.exists(os.path.join(real, t)) for t in tops)

    sys.path[:] = [*roots, *(p for p in sys.path if not foreign(p))]
    results = [probe(e, roots, request["tree"]) for e in request["entries"]]
    sys.stdout.write("\n" + json.dumps(results) + "\n")


if __name__ == "__main__":
    main()
