"""Kinds of spec rule: each one module of ``rules.kinds``, registered on
definition; the schema's ``rules`` section is assembled from them, a spec's
rules are validated and judged by them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import niels_gpt_contracts.rules.kinds as kinds_package
from niels_gpt_contracts.errors import SpecErrors
from niels_gpt_contracts.rules import RuleKind, rule_kinds
from niels_gpt_contracts.stagespec import RUNTIME_KINDS, load_schema, parse_spec

ROOT = Path(__file__).resolve().parents[2]
SCHEMA_TEXT = (ROOT / "specs" / "spec.schema.json").read_text()
CORE = (ROOT / "specs" / "core.toml").read_text()


def _errors(extra: str) -> list[str]:
    """The problems of core's spec with ``extra`` TOML appended ([] when it parses)."""
    try:
        parse_spec("specs/core.toml", CORE + extra, load_schema(SCHEMA_TEXT))
    except SpecErrors as err:
        return [str(e) for e in err.errors]
    return []


def test_every_module_of_the_kinds_package_is_a_registered_kind() -> None:
    modules = {p.stem for p in Path(kinds_package.__path__[0]).glob("[!_]*.py")}
    kinds = rule_kinds()
    assert modules == set(kinds)
    assert {k.owner.rsplit(".", 1)[1] for k in kinds.values()} == modules
    assert {"forbidden_ops"} == RUNTIME_KINDS
    assert all(k.doc and k.required for k in kinds.values())


def test_the_schema_file_leaves_the_kinds_to_the_checker() -> None:
    items = json.loads(SCHEMA_TEXT)["properties"]["rules"]["items"]
    assert "allOf" not in items and "enum" not in items["properties"]["kind"]
    loaded = load_schema(SCHEMA_TEXT)["properties"]["rules"]["items"]
    assert loaded["properties"]["kind"]["enum"] == sorted(rule_kinds())
    branches = [b["if"]["properties"]["kind"]["const"] for b in loaded["allOf"]]
    assert branches == sorted(rule_kinds())


def test_a_spec_rule_is_validated_by_its_kinds_keys() -> None:
    base = '\n[[rules]]\nid = "x"\nmessage = "m"\n'
    assert _errors(base + 'kind = "forbidden_name"\nfiles = ["a.py"]\nnames = ["n"]\n') == []
    (unknown,) = _errors(base + 'kind = "no_such_kind"\n')
    assert "expected one of" in unknown and "'forbidden_name'" in unknown
    (other,) = _errors(base + 'kind = "forbidden_name"\nfiles = ["a"]\nnames = ["n"]\nops = []\n')
    assert "found unknown key" in other and "ops" in other
    (missing,) = _errors(base + 'kind = "forbidden_name"\nfiles = ["a.py"]\n')
    assert "names" in missing and "found it missing" in missing


def test_a_kinds_own_problems_are_reported_at_its_key() -> None:
    ops = 'kind = "forbidden_ops"\nops = ["aten::x"]\ndriver = "specs/rope/d.py:f"\n'
    (driver,) = _errors(f'\n[[rules]]\nid = "x"\nmessage = "m"\n{ops}')
    assert "driver" in driver and "expected a driver under specs/core/" in driver


def test_a_kind_of_one_name_is_defined_once() -> None:
    kind = rule_kinds()["forbidden_name"]
    with pytest.raises(ValueError, match=r"'forbidden_name' is defined in .*forbidden_name"):
        RuleKind(kind.name, kind.doc, kind.fields, kind.required, kind.check, owner="elsewhere")
