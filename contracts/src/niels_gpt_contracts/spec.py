"""The spec model: ``specs/<stage>.toml`` files, validated and typed.

A spec is read from text (the caller decides which revision the text comes
from; the PR gate reads it from the base, never from the PR). Validation runs
the JSON Schema kept in ``specs/spec.schema.json`` and then the checks a schema
cannot express (the id matches the file name, ids are unique, signatures
parse, patterns compile). Every problem becomes a ``SpecError`` naming file,
key and line; all of a file's problems are reported together.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pathspec
import tomllib
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped]

from niels_gpt_contracts.errors import ConfigError, SpecError, SpecErrors
from niels_gpt_contracts.tomllines import KeyPath, dotted, key_lines, line_of

SPECS_DIR = "specs"
SCHEMA_PATH = "specs/spec.schema.json"

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
RUNTIME_KINDS = frozenset({"forbidden_ops"})


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
    axes: tuple[str, ...] = ()  # the domain axes the driver must sweep (checks/coverage)

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


def load_schema(text: str | None, path: str = SCHEMA_PATH) -> dict[str, Any]:
    """Parse the JSON Schema text; ConfigError when absent or broken."""
    if text is None:
        raise ConfigError(f"{path}: expected the spec JSON Schema here, found no such file")
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(
            f"{path}:{err.lineno}: expected JSON, found a syntax error: {err.msg}"
        ) from None
    if not isinstance(schema, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(schema).__name__}")
    digest = hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()
    if digest not in _VALID_SCHEMAS:  # checking against the meta-schema is a pure function
        Draft202012Validator.check_schema(schema)
        _VALID_SCHEMAS.add(digest)
    return schema


# Digests of schema texts that passed ``check_schema`` in this process: a second
# load of the same text (another verdict, another test) skips the check.
_VALID_SCHEMAS: set[str] = set()


def _describe(err: ValidationError) -> tuple[KeyPath, str]:
    """Key path and an 'expected ..., found ...' sentence for a schema error."""
    path: KeyPath = tuple(err.absolute_path)
    inst = err.instance
    found = f"{type(inst).__name__} {inst!r}" if not isinstance(inst, (dict, list)) else None
    v = err.validator
    if v == "required":
        missing = re.findall(r"'([^']+)' is a required property", err.message)
        name = missing[0] if missing else "?"
        return (*path, name), "expected this key, found it missing"
    if v == "additionalProperties" and isinstance(inst, dict):
        allowed = set(err.schema.get("properties", {})) if isinstance(err.schema, dict) else set()
        extra = sorted(k for k in inst if k not in allowed) or ["?"]
        known = ", ".join(sorted(allowed)) or "none"
        return (*path, extra[0]), f"expected one of the keys [{known}], found unknown key"
    if v == "type":
        return path, f"expected {err.validator_value}, found {found or type(inst).__name__}"
    if v in ("enum", "const"):
        want = err.validator_value if v == "enum" else [err.validator_value]
        return path, f"expected one of {want!r}, found {found}"
    if v == "pattern":
        return path, f"expected a value matching {err.validator_value!r}, found {found}"
    if v == "not":
        return path, "expected only the keys this kind allows, found a key of another kind"
    return path, f"expected {v} {err.validator_value!r}, found {found or 'this value'}"


def _signature_ok(text: str) -> str | None:
    try:
        ast.parse(f"def _f{text}:\n    pass\n")
    except SyntaxError as err:
        return f"expected a Python signature like '(x: int) -> int', found {text!r} ({err.msg})"
    return None


def _pattern_problem(patterns: list[str]) -> str | None:
    try:
        compile_patterns(patterns)
    except Exception as err:  # pathspec raises several types for bad patterns
        return f"expected gitignore-style patterns, found one it rejects: {err}"
    return None


def parse_spec(path: str, text: str, schema: Mapping[str, Any]) -> Spec:
    """Validate one spec file's text; raises SpecErrors naming file, key, line."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        m = re.search(r"line (\d+)", str(err))
        raise SpecErrors(
            [SpecError(path, "", int(m.group(1)) if m else None, f"expected TOML, found: {err}")]
        ) from None
    lines = key_lines(text)
    errors: list[SpecError] = []

    def fail(key: KeyPath, problem: str) -> None:
        # A key missing at the top level is placed on line 1.
        errors.append(SpecError(path, dotted(key), line_of(lines, key) or 1, problem))

    validator = Draft202012Validator(schema)
    for schema_err in sorted(
        validator.iter_errors(data), key=lambda e: list(map(str, e.absolute_path))
    ):
        where, what = _describe(schema_err)
        fail(where, what)
    if errors:
        raise SpecErrors(errors)

    stem = path.rsplit("/", 1)[-1].removesuffix(".toml")
    if data["id"] != stem:
        fail(("id",), f"expected the file's name {stem!r}, found {data['id']!r}")
    for section in ("may_change", "must_not_change"):
        problem = _pattern_problem(data["paths"].get(section, []))
        if problem:
            fail(("paths", section), problem)
    for i, entry in enumerate(data["api"]):
        if entry["kind"] == "function":
            problem = _signature_ok(entry["signature"])
            if problem:
                fail(("api", i, "signature"), problem)
        for name, sig in entry.get("methods", {}).items():
            problem = _signature_ok(sig)
            if problem:
                fail(("api", i, "methods", name), problem)
        if entry["kind"] != "module" and ":" not in entry["object"]:
            fail(("api", i, "object"), f"expected 'module:Name', found {entry['object']!r}")
        if entry["kind"] == "module" and ":" in entry["object"]:
            fail(("api", i, "object"), f"expected a module path, found {entry['object']!r}")
    for section, label in (("invariants", "invariant"), ("rules", "rule")):
        seen: dict[str, int] = {}
        for i, item in enumerate(data[section]):
            if item["id"] in seen:
                fail(
                    (section, i, "id"),
                    f"expected a unique {label} id, found {item['id']!r} "
                    f"again (first at {section}[{seen[item['id']]}])",
                )
            seen.setdefault(item["id"], i)
    for i, rule in enumerate(data["rules"]):
        if "files" in rule:
            problem = _pattern_problem(rule["files"])
            if problem:
                fail(("rules", i, "files"), problem)
        driver = rule.get("driver")
        if driver is not None and not driver.startswith(f"{SPECS_DIR}/{data['id']}/"):
            fail(
                ("rules", i, "driver"),
                f"expected a driver under {SPECS_DIR}/{data['id']}/ (maintainer-owned), "
                f"found {driver!r}",
            )
    oracle = data.get("oracle")
    own = f"{SPECS_DIR}/{data['id']}/"
    if oracle is not None:
        files: list[tuple[KeyPath, str]] = [(("oracle", "driver"), oracle["driver"])]
        refs = oracle.get("references", {})
        files += [(("oracle", "references", m), f) for m, f in refs.items()]
        for where, target in files:
            if not target.startswith(own):
                fail(where, f"expected a file under {own} (maintainer-owned), found {target!r}")
    for i, scope in enumerate(data["paths"].get("line_scoped", [])):
        problem = _pattern_problem(scope["paths"])
        if problem:
            fail(("paths", "line_scoped", i, "paths"), problem)
    if errors:
        raise SpecErrors(errors)

    p = data["paths"]
    return Spec(
        id=data["id"],
        path=path,
        title=data["title"],
        version=data.get("version"),
        package=data["package"],
        distribution=data["distribution"],
        depends_on=tuple(data.get("depends_on", [])),
        modules=tuple(data["modules"]),
        may_change=tuple(p["may_change"]),
        must_not_change=tuple(p.get("must_not_change", [])),
        line_scoped=tuple(
            LineScope(
                id=s["id"],
                patterns=tuple(s["paths"]),
                kind=s["kind"],
                callable=s["callable"],
                keyword=s["keyword"],
                description=s["description"],
                matcher=compile_patterns(s["paths"]),
            )
            for s in p.get("line_scoped", [])
        ),
        api=tuple(
            ApiEntry(
                object=a["object"],
                kind=a["kind"],
                signature=a.get("signature"),
                methods=dict(a.get("methods", {})),
                fields=dict(a["fields"]) if "fields" in a else None,
                exports=tuple(a["exports"]) if "exports" in a else None,
                same_as=a.get("same_as"),
            )
            for a in data["api"]
        ),
        rules=tuple(
            Rule(
                id=r["id"],
                kind=r["kind"],
                message=r["message"],
                params={k: v for k, v in r.items() if k not in ("id", "kind", "message")},
                line=line_of(lines, ("rules", i)),
            )
            for i, r in enumerate(data["rules"])
        ),
        invariants=tuple(
            Invariant(id=v["id"], text=v["text"], line=line_of(lines, ("invariants", i)))
            for i, v in enumerate(data["invariants"])
        ),
        mutants=tuple(data.get("mutants", [])),
        oracle=None
        if oracle is None
        else OracleSpec(
            oracle["driver"],
            dict(oracle.get("references", {})),
            tuple(oracle.get("reference_calls", [])),
            tuple(oracle.get("axes", [])),
        ),
        may_match=compile_patterns(p["may_change"]),
        must_not_match=compile_patterns(p.get("must_not_change", [])),
    )


def spec_path(stage: str) -> str:
    return f"{SPECS_DIR}/{stage}.toml"


def parse_specs(texts: Mapping[str, str], schema: Mapping[str, Any]) -> dict[str, Spec]:
    """Validate every spec; cross-check ``depends_on``. Raises SpecErrors for all."""
    specs: dict[str, Spec] = {}
    errors: list[SpecError] = []
    for path in sorted(texts):
        try:
            spec = parse_spec(path, texts[path], schema)
        except SpecErrors as err:
            errors.extend(err.errors)
            continue
        specs[spec.id] = spec
    for spec in specs.values():
        lines = key_lines(texts[spec.path])
        for i, dep in enumerate(spec.depends_on):
            if dep not in specs and not any(e.path == spec_path(dep) for e in errors):
                errors.append(
                    SpecError(
                        spec.path,
                        f"depends_on[{i}]",
                        line_of(lines, ("depends_on", i)),
                        f"expected a stage with a spec in {SPECS_DIR}/, found {dep!r} "
                        f"(known: {', '.join(sorted(specs))})",
                    )
                )
    if errors:
        raise SpecErrors(errors)
    return specs
