"""Spec text to ``Spec``: ``parse_spec`` validates one file, ``parse_specs`` all of
them and the ``depends_on`` between them.

Validation runs the JSON Schema first, then the checks a schema cannot
express (the id matches the file name, ids are unique, signatures parse,
patterns compile, drivers and references are the stage's own files). Every
problem is a ``SpecError`` naming file, key and line; a file's problems are
raised together in one ``SpecErrors``.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

import tomllib
from jsonschema import Draft202012Validator  # type: ignore[import-untyped]

from niels_gpt_contracts.errors import SpecError, SpecErrors
from niels_gpt_contracts.rules import rule_kinds
from niels_gpt_contracts.stagespec.model import (
    SPECS_DIR,
    ApiEntry,
    Invariant,
    LineScope,
    OracleSpec,
    Rule,
    Spec,
    compile_patterns,
    spec_path,
)
from niels_gpt_contracts.stagespec.schema import describe
from niels_gpt_contracts.tomllines import KeyPath, dotted, key_lines, line_of


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
        where, what = describe(schema_err)
        fail(where, what)
    if errors:
        raise SpecErrors(errors)

    stem = path.rsplit("/", 1)[-1].removesuffix(".toml")
    if data["id"] != stem:
        fail(("id",), f"expected the file's name {stem!r}, found {data['id']!r}")
    for section in ("may_change", "must_not_change", "device_branches"):
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
    kinds = rule_kinds()
    for i, rule in enumerate(data["rules"]):
        params = {k: v for k, v in rule.items() if k not in ("id", "kind", "message")}
        for key, problem in kinds[rule["kind"]].problems(params, data["id"]):
            fail(("rules", i, key), problem)
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
            tuple(oracle.get("kit", [])),
        ),
        may_match=compile_patterns(p["may_change"]),
        must_not_match=compile_patterns(p.get("must_not_change", [])),
        device_branches=tuple(p.get("device_branches", [])),
    )


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
