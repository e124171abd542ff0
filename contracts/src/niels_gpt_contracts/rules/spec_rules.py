"""The rules a stage's spec defines (``static.<id>``, ``runtime.<id>``), described
by that spec: ``SpecRule``; and what a *kind* of spec rule is: ``RuleKind``.

A kind is one module of ``rules.kinds``: its TOML keys (a JSON Schema
fragment), the checks a schema cannot express, what it checks in words, and
the check itself (``None`` for a runtime kind, whose driver ``contracts pr``
runs). Defining a ``RuleKind`` registers it; ``rule_kinds`` imports every
module of ``rules.kinds`` and returns the registry, from which the spec
schema's ``rules`` section is assembled (``stagespec.schema``), a spec's rules are
validated (``stagespec.parse``) and judged (``checks.code.static``). Adding a kind is
adding one module there.
"""

from __future__ import annotations

import ast
import importlib
import pkgutil
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import pathspec

from niels_gpt_contracts.rules.doc import GATE_FROM_BASE, RuleDoc

Finding = tuple[str | None, int | None, str]
"""One breach a check found: ``(path, 1-based line, message)``; path or line may be unknown."""

Problem = tuple[str, str]
"""One spec problem a schema cannot express: ``(the rule's key, "expected ..., found ...")``."""

COMMON_KEYS = ("id", "kind", "message", "seed")
"""Keys every rule has (the schema's ``rules.items.properties``), whatever its kind."""


class Source(Protocol):
    """The tree a static check reads (``gitdiff.Tree``): its files and their texts."""

    def files(self) -> list[str]: ...

    def read(self, path: str) -> str | None: ...

    def read_many(self, paths: Iterable[str]) -> dict[str, str | None]: ...


Check = Callable[[Mapping[str, Any], Source, list[str]], list[Finding]]


def _no_problems(params: Mapping[str, Any], stage: str) -> list[Problem]:
    return []


@dataclass(frozen=True)
class RuleKind:
    """One kind of spec rule, registered on definition.

    ``name``: the TOML ``kind``; ``doc``: what a rule of this kind checks (one
    clause, for SARIF); ``fields``: JSON Schema of its own keys, by key;
    ``required``: those a rule must set; ``check(params, tree, files)``: the
    static check (``params``: the rule's keys but id, kind and message), or
    ``None`` for a runtime kind; ``problems(params, stage)``: what the schema
    cannot say, as ``(key, sentence)``.

    Raises:
        ValueError: a kind of that name is registered from another module.
    """

    name: str
    doc: str
    fields: Mapping[str, Any]
    required: tuple[str, ...]
    check: Check | None
    problems: Callable[[Mapping[str, Any], str], list[Problem]] = _no_problems
    owner: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.owner:
            object.__setattr__(self, "owner", sys._getframe(2).f_globals.get("__name__", "?"))
        known = _KINDS.get(self.name)
        if known is not None and known.owner != self.owner:
            raise ValueError(
                f"rule kind {self.name!r} is defined in {known.owner} and {self.owner}"
            )
        _KINDS[self.name] = self

    @property
    def runtime(self) -> bool:
        """Judged by what executes (``contracts pr`` runs its driver), not by reading."""
        return self.check is None

    def schema(self) -> dict[str, Any]:
        """This kind's ``if``/``then`` branch of the schema's ``rules.items.allOf``."""
        return {
            "if": {"properties": {"kind": {"const": self.name}}},
            "then": {
                "additionalProperties": False,
                "required": list(self.required),
                "properties": {**dict.fromkeys(COMMON_KEYS, True), **self.fields},
            },
        }


_KINDS: dict[str, RuleKind] = {}


def rule_kinds() -> dict[str, RuleKind]:
    """Every kind of spec rule, by name: each module of ``rules.kinds`` imported once."""
    package = importlib.import_module("niels_gpt_contracts.rules.kinds")
    for module in pkgutil.iter_modules(package.__path__, f"{package.__name__}."):
        importlib.import_module(module.name)
    return dict(_KINDS)


def patterns_problem(params: Mapping[str, Any], stage: str) -> list[Problem]:
    """``files`` that pathspec rejects, as a problem (kinds that read files use it)."""
    try:
        pathspec.GitIgnoreSpec.from_lines(list(params.get("files", [])))
    except Exception as err:  # pathspec raises several types for bad patterns
        return [("files", f"expected gitignore-style patterns, found one it rejects: {err}")]
    return []


def parsed_sources(
    params: Mapping[str, Any], tree: Source, files: list[str]
) -> Iterator[tuple[str, ast.Module | str]]:
    """``(path, module)`` for each Python file of ``files`` the rule's ``files``
    patterns match, or ``(path, "line N: why")`` where it does not parse."""
    matcher = pathspec.GitIgnoreSpec.from_lines(list(params.get("files", [])))
    paths = [f for f in files if f.endswith(".py") and matcher.match_file(f)]
    for path, text in tree.read_many(paths).items():
        if text is None:
            continue
        try:
            yield path, ast.parse(text)
        except SyntaxError as err:
            yield path, f"line {err.lineno}: {err.msg}"


@dataclass(frozen=True)
class SpecRule:
    """A rule one stage's spec defines (``static.<id>``), described by that spec.

    Two stages may define the same id with different texts; each keeps its own.
    """

    stage: str
    rule: str
    kind: str
    message: str
    spec_path: str
    line: int | None = None

    def doc(self) -> RuleDoc:
        where = f"{self.spec_path}:{self.line}" if self.line else self.spec_path
        known = rule_kinds().get(self.kind)
        what = known.doc if known is not None else f"a rule of kind {self.kind!r}"
        return RuleDoc(
            self.message,
            f"Stage {self.stage!r} defines rule {self.rule!r} ({self.kind}: {what}) in "
            f"{where}: {self.message}. {GATE_FROM_BASE}",
            f"Change the code so that the rule holds again ({self.message}); the rule "
            f"itself changes only with the stage's spec, in a maintainer PR.",
        )
