"""The rule registry: every id the checker can emit is described once, and a
spec-defined id is described by its own stage's spec."""

from __future__ import annotations

import re
from pathlib import Path
from typing import get_args

import niels_gpt_contracts
from niels_gpt_contracts.mutants.runner import Status as MutantStatus
from niels_gpt_contracts.result import RULES, Result, SpecRule

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
    a, b = (result.rule_doc("static.dependencies", s) for s in ("a", "b"))
    assert a.short == "a needs none" and b.short == "b needs a"
    assert "specs/b.toml:7" in b.full and "'b'" in b.full and "b needs a" in b.help
    assert result.rule_doc("path.meta", "a") == RULES["path.meta"]
    unknown = result.rule_doc("static.dependencies", "c")
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
    assert result.rule_doc("runtime.no-x", "top", "specs/mid.toml").short == "mid: no x"
    assert result.spec_rule("runtime.no-x", "top", "specs/other.toml") is None
    result.spec_rules.pop(("low", "runtime.no-x"))
    assert result.rule_doc("runtime.no-x", "top", None).short == "mid: no x"
    assert result.spec_rule("path.meta", "top") is None
