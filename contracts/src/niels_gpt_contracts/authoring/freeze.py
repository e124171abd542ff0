"""A stage's ``[[api]]`` tables frozen from its source: griffe's model, no import.

griffe reads the packages under ``packages/*/src`` statically (``GriffeLoader``
over those search paths, aliases resolved between them, nothing external), so
freezing needs neither torch nor an importable tree. Each pinned object gives
one entry, in the spec's form (``spec.ApiEntry``):

- a module: ``exports``, its ``__all__`` sorted;
- a function: ``signature``, the ``def``'s parameters and return as written;
- a class: ``methods`` (each method's signature, ``self`` included; a
  dataclass's generated ``__init__`` too), ``fields`` (the annotations written
  in the class body, properties and method-local names left out), and
  ``same_as`` when the object is defined in another stage's package and that
  stage's spec names a public path for it (a re-export).

Which objects and which keys are pinned: the spec's own choice where it has
an ``[[api]]`` table (the values are refreshed from code, the selection kept),
else every name of every public package the stage owns (``select_all``):
functions and classes; a class defined in another stage by its ``same_as``
alone, else with its public methods and dunders, inherited from the stages'
code included (griffe does not read torch, so ``nn.Module``'s are not), and
its fields unless it is a dataclass (whose fields are its ``__init__``).
Constants and type aliases are not pinned.
Signatures are spelled as ``checks.public_api.signatures.render`` writes them, so a
frozen table compares with a hand-written one as the API check compares
(``differences``).
"""

from __future__ import annotations

import ast
import json
import textwrap
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import griffe

from niels_gpt_contracts.checks.public_api.signatures import (
    compare_signatures,
    norm,
    parse_signature,
    render,
)
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.stagespec import ApiEntry, Spec

_KINDS = {
    griffe.ParameterKind.positional_only: "POSITIONAL_ONLY",
    griffe.ParameterKind.positional_or_keyword: "POSITIONAL_OR_KEYWORD",
    griffe.ParameterKind.var_positional: "VAR_POSITIONAL",
    griffe.ParameterKind.keyword_only: "KEYWORD_ONLY",
    griffe.ParameterKind.var_keyword: "VAR_KEYWORD",
}
_VAR = frozenset({"VAR_POSITIONAL", "VAR_KEYWORD"})


@dataclass(frozen=True)
class Source:
    """The stages' packages as griffe reads them, and every spec (for ``same_as``)."""

    modules: griffe.ModulesCollection
    specs: Mapping[str, Spec]

    def get(self, path: str) -> griffe.Object | griffe.Alias:
        """The object at ``module:qualname`` (or a module path); ConfigError if absent."""
        module, _, qualname = path.partition(":")
        try:
            obj: griffe.Object | griffe.Alias = self.modules[module]
            for part in filter(None, qualname.split(".")):
                obj = obj[part]
            return _target(obj)
        except (KeyError, griffe.AliasResolutionError, griffe.CyclicAliasError) as err:
            raise ConfigError(f"expected {path} in the stages' source, found none ({err})") from err


def load(root: Path, specs: Mapping[str, Spec], modules: Iterable[str]) -> Source:
    """griffe's model of ``modules`` (dotted names) under ``root``'s ``packages/*/src``."""
    paths = sorted(str(p) for p in root.glob("packages/*/src") if p.is_dir())
    loader = griffe.GriffeLoader(search_paths=paths)
    for name in sorted(set(modules)):
        try:
            loader.load(name)
        except ImportError as err:
            raise ConfigError(f"expected module {name} under packages/*/src, found none") from err
    loader.resolve_aliases(implicit=True, external=False)
    return Source(loader.modules_collection, specs)


def module_names(spec: Spec) -> list[str]:
    """The stage's public modules among the files it owns, none with a private part:
    each package (``__init__.py``), and each module file that is no package's part."""
    packages = {m.rpartition("/")[0] for m in spec.modules if m.endswith("/__init__.py")}
    names = []
    for path in spec.modules:
        folder, _, file = path.rpartition("/")
        parts = [*folder.split("/"), file.removesuffix(".py")]
        if any(p.startswith("_") for p in parts[:-1]) or not file.endswith(".py"):
            continue
        if file == "__init__.py":
            names.append(folder.replace("/", "."))
        elif folder not in packages and not file.startswith("_"):
            names.append(".".join(parts))
    return names


def needed_modules(spec: Spec) -> list[str]:
    """Every module whose source a freeze of ``spec`` reads."""
    found = {e.module for e in spec.api} | set(module_names(spec))
    found |= {e.same_as.partition(":")[0] for e in spec.api if e.same_as}
    return sorted(found)


def signature(func: griffe.Function) -> dict[str, Any]:
    """A function's signature in the probe's normalised form (``checks.public_api.signatures``)."""
    params: list[list[str | None]] = []
    for p in func.parameters:
        kind = _KINDS[p.kind]
        default = None if kind in _VAR or p.default is None else str(p.default)  # as written
        annotation = None if p.annotation is None else _spelled(str(p.annotation), unquote=True)
        params.append([p.name, kind, default, annotation])
    returns = None if func.returns is None else _spelled(str(func.returns), unquote=True)
    return {"params": params, "return": returns}


def _spelled(text: str, unquote: bool = False) -> str | None:
    return norm(ast.parse(text, mode="eval").body, unquote)


def _target(obj: griffe.Object | griffe.Alias) -> griffe.Object:
    """What an alias finally points to (an object is its own)."""
    return obj.final_target if isinstance(obj, griffe.Alias) else obj


def _methods(cls: griffe.Class) -> dict[str, griffe.Function]:
    """Methods reachable on ``cls``, inherited ones included, by name."""
    found: dict[str, griffe.Function] = {}
    for name, member in cls.all_members.items():
        target = _target(member)
        if isinstance(target, griffe.Function):
            found[name] = target
    return found


def fields(cls: griffe.Class) -> dict[str, str]:
    """The annotations written in the class body (what ``inspect.get_annotations`` gives).

    griffe merges ``keys: T`` in the body with ``self.keys = ...`` in a method
    into one attribute placed at the later line, so which names the body
    annotates is read from the class's own source, its top-level ``AnnAssign``s;
    the annotation is griffe's.
    """
    body = ast.parse(textwrap.dedent(cls.source)).body
    top = body[0].body if body and isinstance(body[0], ast.ClassDef) else []
    named = [
        s.target.id for s in top if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
    ]
    out: dict[str, str] = {}
    for name in named:
        member = cls.members.get(name)
        if isinstance(member, griffe.Attribute) and member.annotation is not None:
            out[name] = _spelled(str(member.annotation), unquote=True) or ""
    return out


def _same_as(source: Source, entry_object: str, target: griffe.Object, owner: Spec) -> str | None:
    """The public path another stage's spec gives ``target``, when it is defined there."""
    for spec in source.specs.values():
        if spec.id == owner.id:
            continue
        for other in spec.api:
            if other.kind == "module" or other.object == entry_object or other.same_as:
                continue
            try:
                found = source.get(other.object)
            except ConfigError:
                continue
            if found.path == target.path:
                return other.object
    return None


def freeze_entry(source: Source, owner: Spec, entry: ApiEntry | None, path: str) -> ApiEntry:
    """One entry from code: ``entry``'s keys refreshed, or (``None``) the default choice."""
    obj = source.get(path)
    if isinstance(obj, griffe.Module):
        return ApiEntry(path, "module", exports=tuple(sorted(str(n) for n in obj.exports or [])))
    if isinstance(obj, griffe.Function):
        return ApiEntry(path, "function", signature=render(signature(obj)))
    if not isinstance(obj, griffe.Class):
        raise ConfigError(f"expected a module, function or class at {path}, found {obj.kind.value}")
    reachable = _methods(obj)
    if entry is not None:
        names: Sequence[str] = list(entry.methods)
        want_fields = entry.fields is not None
        want_same = entry.same_as is not None
    else:
        same = _same_as(source, path, obj, owner)
        if same is not None:  # a re-export: the other stage's spec pins the rest
            return ApiEntry(path, "class", same_as=same)
        names = [n for n in reachable if _user_method(n)]
        want_fields = "dataclass" not in obj.labels
        want_same = False
    methods = {}
    for name in names:
        if name not in reachable:
            raise ConfigError(f"expected a method {name!r} on {path}, found none")
        methods[name] = render(signature(reachable[name]))
    found_fields = fields(obj) if want_fields else None
    same = _same_as(source, path, obj, owner) if want_same else None
    if entry is None and not found_fields:
        found_fields = None
    return ApiEntry(path, "class", methods=methods, fields=found_fields, same_as=same)


def _user_method(name: str) -> bool:
    """A method a user calls: public, or a dunder (``__init__``, ``__len__``, ...)."""
    return not name.startswith("_") or (name.startswith("__") and name.endswith("__"))


def select_all(source: Source, spec: Spec) -> list[str]:
    """Every module of the stage and each function and class it exports."""
    paths: list[str] = []
    for module in module_names(spec):
        mod = source.get(module)
        paths.append(module)
        for name in sorted(str(n) for n in getattr(mod, "exports", None) or []):
            target = source.get(f"{module}:{name}")
            if isinstance(target, (griffe.Function, griffe.Class)):
                paths.append(f"{module}:{name}")
    return paths


def freeze(source: Source, spec: Spec, everything: bool = False) -> list[ApiEntry]:
    """The stage's ``[[api]]`` entries from code (``everything``: ``select_all``'s choice)."""
    if spec.api and not everything:
        return [freeze_entry(source, spec, e, e.object) for e in spec.api]
    return [freeze_entry(source, spec, None, p) for p in select_all(source, spec)]


def _string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def to_toml(entries: Iterable[ApiEntry]) -> str:
    """The entries as the ``[[api]]`` tables a spec holds."""
    blocks = []
    for e in entries:
        lines = ["[[api]]", f"object = {_string(e.object)}", f"kind = {_string(e.kind)}"]
        if e.same_as is not None:
            lines.append(f"same_as = {_string(e.same_as)}")
        if e.signature is not None:
            lines.append(f"signature = {_string(e.signature)}")
        if e.exports is not None:
            lines.append(f"exports = [{', '.join(_string(n) for n in e.exports)}]")
        if e.methods:
            lines.append("[api.methods]")
            lines += [f"{_key(k)} = {_string(v)}" for k, v in e.methods.items()]
        if e.fields is not None:
            lines.append("[api.fields]")
            lines += [f"{_key(k)} = {_string(v)}" for k, v in e.fields.items()]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _key(name: str) -> str:
    return name if name.replace("_", "a").isalnum() else _string(name)


def differences(spec_entries: Sequence[ApiEntry], frozen: Sequence[ApiEntry]) -> list[str]:
    """What differs between a spec's entries and the frozen ones, compared as the API
    check compares (signatures parsed and normalised, exports as sets); empty if equal."""
    out: list[str] = []
    have = {e.object: e for e in spec_entries}
    got = {e.object: e for e in frozen}
    out += [f"{o}: in the spec, not frozen from code" for o in have if o not in got]
    out += [f"{o}: frozen from code, not in the spec" for o in got if o not in have]
    for o in (o for o in have if o in got):
        a, b = have[o], got[o]
        if a.kind != b.kind:
            out.append(f"{o}: expected kind {a.kind}, found {b.kind}")
            continue
        if a.signature is not None or b.signature is not None:
            out += _sig(f"{o}", a.signature, b.signature, False)
        for name in sorted(set(a.methods) | set(b.methods)):
            out += _sig(f"{o}.{name}", a.methods.get(name), b.methods.get(name), name == "__init__")
        if _norm_fields(a.fields) != _norm_fields(b.fields):
            out.append(f"{o}: expected fields {dict(a.fields or {})}, found {dict(b.fields or {})}")
        if sorted(a.exports or ()) != sorted(b.exports or ()):
            out.append(
                f"{o}: expected exports {sorted(a.exports or ())}, found {sorted(b.exports or ())}"
            )
        if a.same_as != b.same_as:
            out.append(f"{o}: expected same_as {a.same_as}, found {b.same_as}")
    return out


def _sig(label: str, spec_text: str | None, code_text: str | None, is_init: bool) -> list[str]:
    if spec_text is None or code_text is None:
        return [f"{label}: expected {spec_text or '(not pinned)'}, found {code_text or '(none)'}"]
    diffs = compare_signatures(parse_signature(spec_text), parse_signature(code_text), is_init)
    return [f"{label}: {d}" for d in diffs]


def _norm_fields(found: Mapping[str, str] | None) -> dict[str, str | None] | None:
    if found is None:
        return None
    return {k: norm(ast.parse(v, mode="eval").body) for k, v in found.items()}
