"""The typed spec model: ``Spec`` and its parts, as ``parse`` builds them from a
validated ``specs/<stage>.toml``, and the paths every spec shares.

``META_PATTERNS``/``META_SPEC``: the paths no stage owns. ``import_name``
turns an owned module file into its dotted name; ``compile_patterns`` turns
gitignore-style patterns into a matcher. Nothing here reads a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pathspec

from niels_gpt_contracts.rules import rule_kinds

SPECS_DIR = "specs"
SCHEMA_PATH = "specs/spec.schema.json"
# The maintainers' kit: the ``speckit`` package of spec-side helpers several stages
# import (``checks.context.speckit``). No stage id starts with "_" (the schema's pattern), so
# it is no stage's folder.
KIT_DIR = "specs/_kit"
KIT_PACKAGE = "speckit"

# Paths that belong to no stage: the gate itself, its specs, CI and the
# repository-wide tooling. A stage PR that touches one fails as a meta change.
# The root conftest.py is here because every test run loads it.
# The root README.md is deliberately not here: it is nobody's, so a stage PR
# that edits it fails as "not allowed" rather than as a meta change.
META_PATTERNS: tuple[str, ...] = (
    "/specs",
    "/contracts",
    "/.github",
    "/.ci",
    "/noxfile.py",
    "/noxkit",  # noxfile.py's helpers: how every stage's tests are run
    "/constraints.txt",
    "/pyproject.toml",
    "/.pre-commit-hooks.yaml",
    "/conftest.py",
)


def import_name(module_path: str) -> str:
    """The dotted name a module file is imported as: ``niels_gpt/model/rope.py`` and
    ``niels_gpt/model/rope/__init__.py`` (a package of its own) are both
    ``niels_gpt.model.rope``."""
    return module_path.removesuffix(".py").removesuffix("/__init__").replace("/", ".")


def compile_patterns(patterns: list[str] | tuple[str, ...]) -> pathspec.GitIgnoreSpec:
    """gitignore-style patterns as a matcher (pathspec does the matching)."""
    return pathspec.GitIgnoreSpec.from_lines(list(patterns))


META_SPEC = compile_patterns(META_PATTERNS)
# Kinds of rule judged by what executes, not by reading (``rules.kinds``).
RUNTIME_KINDS = frozenset(name for name, kind in rule_kinds().items() if kind.runtime)


@dataclass(frozen=True)
class LineScope:
    """Files a PR may change only on lines its kind allows."""

    id: str
    patterns: tuple[str, ...]
    kind: str
    callable: str
    keyword: str
    description: str
    matcher: pathspec.GitIgnoreSpec = field(compare=False, repr=False)


@dataclass(frozen=True)
class ApiEntry:
    """One public object: where it is imported from, its kind and shape."""

    object: str
    kind: str
    signature: str | None = None
    methods: Mapping[str, str] = field(default_factory=dict)
    fields: Mapping[str, str] | None = None
    exports: tuple[str, ...] | None = None
    same_as: str | None = None

    @property
    def module(self) -> str:
        return self.object.partition(":")[0]

    @property
    def qualname(self) -> str:
        return self.object.partition(":")[2]


@dataclass(frozen=True)
class Rule:
    """A static rule; ``params`` holds its kind-specific keys."""

    id: str
    kind: str
    message: str
    params: Mapping[str, Any]
    line: int | None

    @property
    def runtime(self) -> bool:
        """Judged by what executes (``contracts pr`` runs its driver), not by reading."""
        return self.kind in RUNTIME_KINDS

    @property
    def rule_id(self) -> str:
        return f"{'runtime' if self.runtime else 'static'}.{self.id}"

    def patterns(self, key: str = "files") -> pathspec.GitIgnoreSpec:
        return compile_patterns(list(self.params.get(key, [])))


@dataclass(frozen=True)
class OracleSpec:
    """The stage's differential oracle (``[oracle]``): driver, float64 references."""

    driver: str  # specs/<stage>/<file>.py:<function>
    references: Mapping[str, str] = field(default_factory=dict)  # module -> specs/<stage>/x.py
    reference_calls: tuple[str, ...] = ()
    axes: tuple[str, ...] = ()  # the domain axes the driver must sweep (checks/evidence/coverage)
    kit: tuple[
        str, ...
    ] = ()  # the spec kit's modules its spec-side files import (checks.context.speckit)

    @property
    def driver_file(self) -> str:
        return self.driver.partition(":")[0]

    @property
    def function(self) -> str:
        return self.driver.partition(":")[2]


@dataclass(frozen=True)
class Invariant:
    id: str
    text: str
    line: int | None


@dataclass(frozen=True)
class Spec:
    """A validated stage spec."""

    id: str
    path: str
    title: str
    version: str | None  # MAJOR.MINOR.PATCH (schema 3); None in a schema-2 spec
    package: str
    distribution: str
    depends_on: tuple[str, ...]
    modules: tuple[str, ...]
    may_change: tuple[str, ...]
    must_not_change: tuple[str, ...]
    line_scoped: tuple[LineScope, ...]
    api: tuple[ApiEntry, ...]
    rules: tuple[Rule, ...]
    invariants: tuple[Invariant, ...]
    mutants: tuple[Mapping[str, Any], ...]
    oracle: OracleSpec | None
    may_match: pathspec.GitIgnoreSpec = field(compare=False, repr=False)
    must_not_match: pathspec.GitIgnoreSpec = field(compare=False, repr=False)
    # the stage files where a branch on the device type may stand (checks.code.device_branches)
    device_branches: tuple[str, ...] = ()

    def invariant_ids(self) -> set[str]:
        return {f"{self.id}.{inv.id}" for inv in self.invariants}

    @property
    def src(self) -> str:
        """The package's source root, e.g. ``packages/rope/src``."""
        return f"{self.package}/src"

    @property
    def module_files(self) -> tuple[str, ...]:
        """The owned modules as repository paths (``packages/rope/src/niels_gpt/model/rope.py``)."""
        return tuple(f"{self.src}/{m}" for m in self.modules)

    @property
    def acceptance_dir(self) -> str:
        """Where the maintainer-owned acceptance tests of the stage live (a meta path)."""
        return f"{SPECS_DIR}/{self.id}/tests"


def spec_path(stage: str) -> str:
    return f"{SPECS_DIR}/{stage}.toml"
