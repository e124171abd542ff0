"""The rule index: every id the checker can emit is described once, by the
module that emits it, and a spec-defined id by its own stage's spec."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import pytest

import niels_gpt_contracts
from niels_gpt_contracts.mutants.runner import Status as MutantStatus
from niels_gpt_contracts.reporters import rule_index
from niels_gpt_contracts.reporters.rule_index import RULES, gather, rule_doc, spec_rule
from niels_gpt_contracts.result import Result, SpecRule

SOURCE = Path(niels_gpt_contracts.__file__).resolve().parent
# Families of fixed ids, those in use and those announced (issue 9's brief).
FAMILIES = {r.split(".", 1)[0] for r in RULES} | {"module", "source", "tests", "runtime"}
ALTERNATIVES = "|".join(sorted(FAMILIES))
LITERAL = re.compile(rf"[\"']((?:{ALTERNATIVES})\.[a-z][a-z0-9-]*)[\"']")


def emitted_ids() -> set[str]:
    """Every quoted ``<family>.<name>`` in the checker's sources, and the
    mutant ids it builds from a status."""
    found = {
        m.group(1)
        for path in SOURCE.rglob("*.py")
        if path.name != "rules.py"
        for m in LITERAL.finditer(path.read_text(encoding="utf-8"))
    }
    return found | {f"mutant.{s}" for s in get_args(MutantStatus) if s != "killed"}


def test_every_emitted_rule_id_is_registered() -> None:
    found = emitted_ids()
    assert {"path.meta", "api.signature", "device.not-run", "mutant.survived"} <= found
    assert sorted(found - set(RULES)) == []


def test_every_registered_rule_is_described_three_ways() -> None:
    for rule, doc in RULES.items():
        assert re.fullmatch(r"[a-z]+\.[a-z][a-z0-9-]*", rule), rule
        texts = (doc.short, doc.full, doc.help)
        assert all(t.strip() and t.strip()[-1] in ".)" for t in texts), rule
        assert len(set(texts)) == 3, rule
        assert len(doc.short) < 80, rule


def test_spec_rules_are_described_stage_by_stage() -> None:
    result = Result(mode="tree", stages=["a", "b"])
    result.add_spec_rule(SpecRule("a", "static.dependencies", "dependencies", "a needs none", "x"))
    result.add_spec_rule(
        SpecRule("b", "static.dependencies", "dependencies", "b needs a", "specs/b.toml", 7)
    )
    a, b = (rule_doc(result, "static.dependencies", s) for s in ("a", "b"))
    assert a.short == "a needs none" and b.short == "b needs a"
    assert "specs/b.toml:7" in b.full and "'b'" in b.full and "b needs a" in b.help
    assert rule_doc(result, "path.meta", "a") == RULES["path.meta"]
    unknown = rule_doc(result, "static.dependencies", "c")
    assert "no registered description" in unknown.full


def test_a_rule_judged_under_a_dependant_stage_keeps_its_owners_text() -> None:
    """Runtime rules of the stages a PR's stage depends on are reported under
    the PR's stage, at the owner's spec."""
    result = Result(mode="pr", stages=["top"])
    for stage in ("low", "mid"):
        result.add_spec_rule(
            SpecRule(
                stage, "runtime.no-x", "forbidden_ops", f"{stage}: no x", f"specs/{stage}.toml"
            )
        )
    assert rule_doc(result, "runtime.no-x", "top", "specs/mid.toml").short == "mid: no x"
    assert spec_rule(result, "runtime.no-x", "top", "specs/other.toml") is None
    result.spec_rules.pop(("low", "runtime.no-x"))
    assert rule_doc(result, "runtime.no-x", "top", None).short == "mid: no x"
    assert spec_rule(result, "path.meta", "top") is None


def test_each_id_is_described_by_a_module_that_emits_it() -> None:
    """A module's ``RULE_DOCS`` holds only ids its own code raises: the id's text is
    quoted there again outside the table, built from a status (``mutant.<status>``),
    or the id of one of its rule objects, which hold their check (``RULES``)."""
    for module in rule_index.EMITTERS:
        text = Path(str(module.__file__)).read_text(encoding="utf-8")
        objects = {r.id for r in getattr(module, "RULES", ())}  # a rule object carries its check
        for rule in module.RULE_DOCS:
            quoted = text.count(f'"{rule}"')
            built = rule.startswith("mutant.") and 'f"mutant.{' in text
            assert quoted >= 2 or built or rule in objects, (
                f"{module.__name__} describes {rule} but never emits it"
            )


def test_an_id_two_modules_describe_is_refused() -> None:
    doc = RULES["path.meta"]
    assert gather([("a", {"x.y": doc}), ("b", {"x.z": doc})]) == {"x.y": doc, "x.z": doc}
    with pytest.raises(ValueError, match=r"'x.y' is described in a and in b"):
        gather([("a", {"x.y": doc}), ("b", {"x.y": doc})])


def test_no_module_outside_the_index_describes_rules() -> None:
    """Every module with a ``RULE_DOCS`` table is one the index gathers."""
    gathered = {Path(str(m.__file__)).resolve() for m in rule_index.EMITTERS}
    tables = {p.resolve() for p in SOURCE.rglob("*.py") if "\nRULE_DOCS: " in p.read_text()}
    assert sorted(map(str, tables - gathered)) == []
