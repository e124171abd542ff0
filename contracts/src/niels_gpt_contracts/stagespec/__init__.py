"""The spec model: ``specs/<stage>.toml`` files, validated and typed.

A spec is read from text (the caller decides which revision the text comes
from; the PR gate reads it from the base, never from the PR). Validation runs
the JSON Schema kept in ``specs/spec.schema.json`` and then the checks a schema
cannot express (the id matches the file name, ids are unique, signatures
parse, patterns compile). Every problem becomes a ``SpecError`` naming file,
key and line; all of a file's problems are reported together.

The package holds the typed model (``model``), the schema and its error
sentences (``schema``) and the parsing (``parse``); every name is imported
from here.
"""

from __future__ import annotations

from niels_gpt_contracts.stagespec.model import (
    KIT_DIR,
    KIT_PACKAGE,
    META_PATTERNS,
    META_SPEC,
    RUNTIME_KINDS,
    SCHEMA_PATH,
    SPECS_DIR,
    ApiEntry,
    Invariant,
    LineScope,
    OracleSpec,
    Rule,
    Spec,
    compile_patterns,
    import_name,
    spec_path,
)
from niels_gpt_contracts.stagespec.parse import parse_spec, parse_specs
from niels_gpt_contracts.stagespec.schema import load_schema

__all__ = [
    "KIT_DIR",
    "KIT_PACKAGE",
    "META_PATTERNS",
    "META_SPEC",
    "RUNTIME_KINDS",
    "SCHEMA_PATH",
    "SPECS_DIR",
    "ApiEntry",
    "Invariant",
    "LineScope",
    "OracleSpec",
    "Rule",
    "Spec",
    "compile_patterns",
    "import_name",
    "load_schema",
    "parse_spec",
    "parse_specs",
    "spec_path",
]
