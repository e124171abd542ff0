"""The rule registry: every fixed id the checker can emit is a ``Rule`` object,
defined and documented once beside the code that emits it and registered by
being defined; a spec-defined id is described by its own stage's spec."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

import niels_gpt_contracts
from niels_gpt_contracts.reporters.rule_index import RULES, emitting_modules, rule_doc, spec_rule
from niels_gpt_contracts.result import Result, SpecRule
from niels_gpt_contracts.rules import Rule, registered
from niels_gpt_contracts.rules.registry import RULE_ID

SOURCE = Path(niels_gpt_contracts.__file__).resolve().parent
PACKAGE = SOURCE.parent
# Families of fixed ids, those in use and those announced (issue 9's brief).
FAMILIES = {r.split(".", 1)[0] for r in RULES} | {"module", "source", "tests", "runtime"}
LITERAL = re.compile(rf"[\"']((?:{'|'.join(sorted(FAMILIES))})\.[a-z][a-z0-9-]*)[\"']")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE).with_suffix("").parts)


def _sources() -> dict[Path, str]:
    return {p: p.read_text(encoding="utf-8") for p in sorted(SOURCE.rglob("*.py"))}


def _definitions(text: str) -> list[tuple[str | None, str, int]]:
    """``(constant, id, line)`` of each ``Rule("<id>", ...)`` call in ``text``."""
    found = []
    named: dict[ast.AST, str] = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            named[node.value] = node.targets[0].id
        if not isinstance(node, ast.Call):
            continue
        call, name = node, named.get(node)
        if isinstance(call.func, ast.Name) and call.func.id == "Rule" and call.args:
            first = call.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                found.append((name, first.value, call.lineno))
    return found


def _id_literals(text: str) -> list[tuple[str, int]]:
    """Every code string (docstrings left out) that is exactly a rule id of a known family."""
    docstrings = {
        node.body[0].value.lineno
        for node in ast.walk(ast.parse(text))
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.STRING and tok.start[0] not in docstrings:
            match = LITERAL.fullmatch(tok.string)
            if match:
                out.append((match.group(1), tok.start[0]))
    return out


def test_every_rule_defined_anywhere_is_registered_and_found() -> None:
    """A ``Rule`` is defined only in a module the index imports, so the registry
    the reports read holds every rule the checker can emit."""
    emitting = set(emitting_modules())
    defined = {}
    for path, text in _sources().items():
        for _name, rule, line in _definitions(text):
            if path.name == "registry.py":
                continue  # the docstring's example
            assert _module(path) in emitting, f"{path}:{line} defines {rule} outside the index"
            defined[rule] = _module(path)
    assert {"path.meta", "api.signature", "device.not-run", "mutant.survived"} <= set(defined)
    assert {r: RULES[r].owner for r in defined} == defined
    assert set(RULES) == set(defined)


def test_no_rule_id_is_emitted_as_a_string() -> None:
    """An emission site names its rule through the object (``PATH_META.id``): an id
    written as a string literal anywhere in code is one the registry may not hold."""
    found = []
    for path, text in _sources().items():
        defined = {(rule, line) for _n, rule, line in _definitions(text)}
        for rule, line in _id_literals(text):
            if not any(r == rule and line - 1 <= at <= line for r, at in defined):
                found.append(f"{path.relative_to(SOURCE)}:{line}: {rule}")
    assert found == []


def test_the_string_scan_sees_a_quoted_id() -> None:
    """The scan above fails on the thing it guards against (red without the fix)."""
    text = 'from x import Violation\n\n\ndef f():\n    """Says "path.meta"."""\n'
    text += '    return Violation("path.meta", None)\n'
    assert _id_literals(text) == [("path.meta", 6)]


def test_every_rule_is_emitted_by_code() -> None:
    """A rule object is used beyond its definition (an emission, a table of
    rules such as ``ProtocolRule``'s or ``fates.BY_STATUS``): no rule is
    documented that nothing raises."""
    texts = _sources()
    for rule in RULES.values():
        path = SOURCE.joinpath(*rule.owner.split(".")[1:]).with_suffix(".py")
        names = [n for n, r, _l in _definitions(texts[path]) if r == rule.id]
        if names == [None]:  # defined inside a table of rule objects that hold their check
            continue
        (name,) = names
        uses = sum(len(re.findall(rf"\b{name}\b", t)) for t in texts.values())
        assert uses >= 2, f"{rule.owner} defines {rule.id} ({name}) but nothing emits it"


def test_every_registered_rule_is_described_three_ways() -> None:
    for rule_id, rule in RULES.items():
        assert RULE_ID.fullmatch(rule_id), rule_id
        texts = (rule.short, rule.full, rule.help)
        assert all(t.strip() and t.strip()[-1] in ".)" for t in texts), rule_id
        assert len(set(texts)) == 3, rule_id
        assert len(rule.short) < 80, rule_id


def test_a_rule_registers_itself_and_refuses_a_second_owner() -> None:
    first = Rule("zz.test-only", "Short.", "Full.", "Help.")
    assert registered()["zz.test-only"] is first and first.owner == __name__
    again = Rule("zz.test-only", "Short again.", "Full.", "Help.")  # a reload: same module
    assert registered()["zz.test-only"] is again
    with pytest.raises(
        ValueError, match=r"'zz.test-only' is defined in .*test_report_rules and in elsewhere"
    ):
        Rule("zz.test-only", "S.", "F.", "H.", owner="elsewhere")
    with pytest.raises(ValueError, match=r"rule id 'Bad Id' is not <family>.<name>"):
        Rule("Bad Id", "S.", "F.", "H.")
    assert "zz.test-only" not in RULES  # the index was read before


def test_spec_rules_are_described_stage_by_stage() -> None:
    result = Result(mode="tree", stages=["a", "b"])
    result.add_spec_rule(SpecRule("a", "static.dependencies", "dependencies", "a needs none", "x"))
    result.add_spec_rule(
        SpecRule("b", "static.dependencies", "dependencies", "b needs a", "specs/b.toml", 7)
    )
    a, b = (rule_doc(result, "static.dependencies", s) for s in ("a", "b"))
    assert a.short == "a needs none" and b.short == "b needs a"
    assert "specs/b.toml:7" in b.full and "'b'" in b.full and "b needs a" in b.help
    assert rule_doc(result, "path.meta", "a") == RULES["path.meta"].doc
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
