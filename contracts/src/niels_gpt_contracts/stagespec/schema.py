"""``specs/spec.schema.json``: loaded once per text, and its errors told as
sentences.

``load_schema`` parses the schema's text, completes its ``rules`` section from
the kinds of spec rule (``assemble``: each kind's keys are its own module's,
``rules.kinds``, never written in the file) and checks it against the JSON
Schema meta-schema (``ConfigError`` when it is absent, not JSON, or not an
object); ``describe`` turns one ``jsonschema`` ``ValidationError`` into the
key path it concerns and an "expected ..., found ..." sentence.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from jsonschema import Draft202012Validator  # type: ignore[import-untyped]
from jsonschema.exceptions import ValidationError  # type: ignore[import-untyped]

from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.rules import rule_kinds
from niels_gpt_contracts.stagespec.model import SCHEMA_PATH
from niels_gpt_contracts.tomllines import KeyPath


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
    schema = assemble(schema, path)
    digest = hashlib.sha256(json.dumps(schema, sort_keys=True).encode()).hexdigest()
    if digest not in _VALID_SCHEMAS:  # checking against the meta-schema is a pure function
        Draft202012Validator.check_schema(schema)
        _VALID_SCHEMAS.add(digest)
    return schema


def assemble(schema: dict[str, Any], path: str = SCHEMA_PATH) -> dict[str, Any]:
    """``schema`` with its rules' ``kind`` enum and per-kind branches (``allOf``)
    built from the registered kinds (``rules.rule_kinds``), in name order.

    Raises:
        ConfigError: the schema has no ``properties.rules.items.properties`` object.
    """
    try:
        items = schema["properties"]["rules"]["items"]
        kind = items["properties"]["kind"]
    except (KeyError, TypeError):
        raise ConfigError(
            f"{path}: expected properties.rules.items.properties.kind, found none"
        ) from None
    kinds = rule_kinds()
    kind["enum"] = sorted(kinds)
    items["allOf"] = [kinds[name].schema() for name in sorted(kinds)]
    return schema


# Digests of assembled schemas that passed ``check_schema`` in this process: a second
# load of the same text (another verdict, another test) skips the check.
_VALID_SCHEMAS: set[str] = set()


def describe(err: ValidationError) -> tuple[KeyPath, str]:
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
