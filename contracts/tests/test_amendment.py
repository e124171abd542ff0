"""Spec amendments: a ``Spec: <stage>`` range classified KEPT, ADDITIVE or BREAKING.

Every case is a real commit range in a temporary repository (``gatekit``'s
alpha/beta monorepo), judged by ``contracts check --base main --head HEAD``
and, for one case, by ``contracts pr``; each JSON report goes through the
published report schema.
"""

from __future__ import annotations

import contextlib
import io
import sys

import pytest
from amendkit import ALPHA, amend, judge, row
from gatekit import Repo, rules, valid_report

from niels_gpt_contracts.checks.spec_changes.evidence_diff import compare_file
from niels_gpt_contracts.checks.spec_changes.spec_diff import classify, worst
from niels_gpt_contracts.cli import main
from niels_gpt_contracts.stagespec import import_name

SIG = "(x: list[float], *, turns: int = 1, label: str | None = None) -> list[float]"
ACCEPT = "specs/alpha/tests/test_accept.py"
ACCEPT_TEST = """\
import pytest

from ngx.alpha_mod import rotate


@pytest.mark.invariant("alpha.keeps_length")
def test_accept_length():
    assert len(rotate([1.0, 2.0, 3.0])) == 3
"""


def test_a_comment_and_a_title_are_kept(repo: Repo) -> None:
    amend(repo, 'title = "Alpha stage"', '# why alpha exists\ntitle = "The alpha stage"')
    code, out = judge(repo)
    assert code == 0, out
    assert row(out)["status"] == "KEPT"
    assert row(out)["summary"].startswith("KEPT 1.0.0 -> 1.0.0: title reworded")
    code, text, _ = repo.gate("--no-api", "--base", "main", "--head", "HEAD")
    assert code == 0
    assert "judging the spec amendment of alpha" in text
    assert "KEPT     alpha  amendment    KEPT 1.0.0 -> 1.0.0" in text


def test_a_keyword_with_a_default_and_an_invariant_are_additive(repo: Repo) -> None:
    new_sig = SIG.replace(") ->", ", scale: float = 1.0) ->")
    amend(repo, SIG, new_sig, "1.1.0")
    repo.replace(
        ALPHA, "[[invariants]]", '[[invariants]]\nid = "scales"\ntext = "s."\n\n[[invariants]]'
    )
    repo.git("commit", "-q", "--amend", "-a", "--no-edit")
    code, out = judge(repo)
    assert code == 0, out
    summary = row(out)["summary"]
    assert summary.startswith("ADDITIVE 1.0.0 -> 1.1.0")
    assert "ngx.alpha_mod:rotate: +keyword scale" in summary and "invariant +scales" in summary


def test_additive_without_a_minor_bump_is_broken(repo: Repo) -> None:
    amend(repo, 'exports = ["Thing", "rotate"]', 'exports = ["Thing", "rotate", "spin"]', "1.0.1")
    code, out = judge(repo)
    assert code == 1
    assert ("amendment.version", ALPHA) in rules(out)
    assert "expected a minor bump for ADDITIVE (1.1.0), found 1.0.1" in str(out["violations"])


@pytest.mark.parametrize(
    ("old", "new", "what"),
    [
        ('exports = ["Thing", "rotate"]', 'exports = ["rotate"]', "export -Thing"),
        (SIG, SIG.replace("turns: int = 1", "turns: int = 2"), "parameter 'turns' changed"),
        (SIG, SIG.replace(", label: str | None = None", ""), "parameter 'label' removed"),
        (SIG, SIG.replace("*, turns", "scale: float, *, turns"), "+scale, positional"),
        (SIG, SIG.replace("-> list[float]", "-> list[int]"), "return changed"),
        ('methods = ["to", "float", "*cast*"]', 'methods = ["to", "float"]', "methods -*cast*"),
        ("allowed = []\n", 'allowed = ["numpy"]\n', "allowed +numpy"),
        ('may_change = ["packages/alpha/**"]', 'may_change = ["packages/**"]', "may_change +"),
        ('must_not_change = ["packages/beta/**"]', "must_not_change = []", "must_not_change -"),
        (
            'id = "turns_compose"\ntext = "Rotating twice',
            'id = "turns_compose"\ntext = "Rotating',
            "invariant turns_compose: text",
        ),
        ("follow_local_calls = true", "follow_local_calls = false", "follow_local_calls False"),
    ],
)
def test_breaking_changes_need_a_declared_major_bump(
    repo: Repo, old: str, new: str, what: str
) -> None:
    amend(repo, old, new, "1.1.0")
    code, out = judge(repo)
    assert code == 1, out
    found = rules(out)
    assert ("amendment.breaking", ALPHA) in found and ("amendment.version", ALPHA) in found
    assert what in str(out["violations"])
    repo.replace(ALPHA, 'version = "1.1.0"', 'version = "2.0.0"')
    repo.git("commit", "-q", "-a", "-m", "amend alpha\n\nSpec: alpha\nSpec-Break: on purpose")
    code, out = judge(repo)
    assert code == 0, out
    assert row(out)["summary"].startswith("BREAKING 1.0.0 -> 2.0.0")


def test_a_dropped_invariant_declared_but_not_major_is_broken(repo: Repo) -> None:
    amend(
        repo,
        '[[invariants]]\nid = "turns_compose"\ntext = "Rotating twice by one turn equals rotating once by two."\n',  # noqa: E501
        "",
        "1.1.0",
        "Spec: alpha",
        "Spec-Break: compose is not a promise any more",
    )
    code, out = judge(repo)
    assert code == 1
    assert rules(out) == {("amendment.version", ALPHA)}
    assert "expected a major bump for a break (2.0.0), found 1.1.0" in str(out["violations"])


def test_a_declared_break_the_data_cannot_show_needs_the_major_bump(repo: Repo) -> None:
    amend(
        repo,
        'title = "Alpha stage"',
        'title = "Alpha"',
        "2.0.0",
        "Spec: alpha",
        "Spec-Break: rotate now turns left, as the comment says",
    )
    code, out = judge(repo)
    assert code == 0, out
    assert row(out)["summary"].startswith("KEPT (declared break) 1.0.0 -> 2.0.0")


def test_a_version_never_goes_down(repo: Repo) -> None:
    repo.replace(ALPHA, 'version = "1.0.0"', 'version = "1.2.0"')
    repo.git("commit", "-q", "-a", "-m", "maintainers bump")
    repo.git("branch", "-f", "main", "HEAD")
    amend(repo, 'version = "1.2.0"', 'version = "1.1.9"')
    code, out = judge(repo)
    assert code == 1
    assert "expected a version >= the base's 1.2.0, found 1.1.9" in str(out["violations"])


def test_a_spec_change_needs_a_trailer_naming_its_stage(repo: Repo) -> None:
    repo.replace("specs/beta.toml", 'title = "Beta stage"', 'title = "Beta"')
    amend(repo, 'title = "Alpha stage"', 'title = "Alpha"')
    code, out = judge(repo)
    assert code == 1
    assert ("amendment.trailer", "specs/beta.toml") in rules(out)
    repo.git("commit", "-q", "--allow-empty", "-m", "naming nobody\n\nSpec: gamma")
    code, out = judge(repo)
    assert "'Spec: gamma' names no stage's spec" in str(out["violations"])


def test_an_amendment_carries_no_code(repo: Repo) -> None:
    repo.replace("packages/alpha/src/ngx/alpha_mod.py", "n = turns % len(x)", "n = 0")
    repo.write("packages/alpha/tests/test_more.py", "def test_x():\n    pass\n")
    amend(repo, 'title = "Alpha stage"', 'title = "Alpha"')
    code, out = judge(repo)
    assert code == 1
    found = rules(out)
    assert ("amendment.path", "packages/alpha/src/ngx/alpha_mod.py") in found
    assert ("amendment.path", "packages/alpha/tests/test_more.py") in found  # not a declared break


def test_a_declared_break_may_rewrite_its_stages_tests(repo: Repo) -> None:
    repo.replace("packages/alpha/tests/test_alpha.py", "== 2\n", "== 2  # pinned\n")
    amend(
        repo,
        'exports = ["Thing", "rotate"]',
        'exports = ["rotate"]',
        "2.0.0",
        "Spec: alpha",
        "Spec-Break: Thing goes",
    )
    code, out = judge(repo)
    assert code == 0, out
    assert "test_alpha.py::test_keeps_length" not in row(out)["summary"]  # a comment: no edit


def test_acceptance_tests_added_are_additive_and_edited_are_breaking(repo: Repo) -> None:
    repo.write(ACCEPT, ACCEPT_TEST)
    amend(repo, "", "", "1.1.0")
    code, out = judge(repo)
    assert code == 0, out
    assert f"{ACCEPT} added" in row(out)["summary"]
    repo.git("branch", "-f", "main", "HEAD")
    repo.replace(ACCEPT, "== 3", ">= 0")
    repo.replace(ACCEPT, "import pytest\n", '"""Loosened."""\nimport pytest\n')
    amend(repo, "", "")
    code, out = judge(repo)
    assert code == 1
    assert f"{ACCEPT}::test_accept_length edited" in str(out["violations"])


def test_an_invalid_amended_spec_is_broken_not_an_error(repo: Repo) -> None:
    amend(repo, 'version = "1.0.0"', 'version = "one"')
    code, out = judge(repo)
    assert code == 1
    assert ("amendment.invalid", ALPHA) in rules(out)


def test_stage_and_spec_trailers_together_are_no_verdict(repo: Repo) -> None:
    amend(repo, 'title = "Alpha stage"', 'title = "Alpha"', None, "Spec: alpha", "Stage: alpha")
    code, _, err = repo.gate("--no-api", "--base", "main", "--head", "HEAD")
    assert code == 2
    assert "found both" in err


@pytest.mark.parametrize("fmt", ["text", "junit", "sarif", "github"])
def test_every_format_reports_the_amendment(repo: Repo, fmt: str) -> None:
    amend(repo, 'exports = ["Thing", "rotate"]', 'exports = ["rotate"]', "1.1.0")
    code, out, _ = repo.gate("--no-api", "--base", "main", "--head", "HEAD", "--format", fmt)
    assert code == 1
    assert "amendment.breaking" in out and "amendment.version" in out


def test_contracts_pr_gives_the_same_amendment_verdict(repo: Repo) -> None:
    amend(repo, 'exports = ["Thing", "rotate"]', 'exports = ["Thing", "rotate", "spin"]', "1.1.0")
    out = io.StringIO()
    args = ["pr", "--repo", str(repo.root), "--base", "main", "--head", "HEAD"]
    args += ["--python", sys.executable, "--cache-dir", str(repo.root / ".cache")]
    with contextlib.redirect_stdout(out):
        code = main([*args, "--format", "json"])
    assert code == 0, out.getvalue()
    payload = valid_report(out.getvalue())
    assert row(payload)["summary"] == "ADDITIVE 1.0.0 -> 1.1.0: ngx.alpha_mod export +spin"


# --- the classifiers on their own -----------------------------------------------------


def test_classify_reads_levels_from_data_not_text() -> None:
    base = {"id": "s", "invariants": [{"id": "a", "text": "A."}], "rules": []}
    assert classify(base, dict(base)) == []
    grown = {**base, "invariants": [*base["invariants"], {"id": "b", "text": "B."}]}
    assert worst(classify(base, grown)) == "ADDITIVE"
    assert worst(classify(grown, base)) == "BREAKING"
    assert worst(classify(base, {**base, "whatever": 1})) == "BREAKING"  # unknown: declare it
    retarget = {"id": "m", "text": "bug", "file": "f.py", "find": "a", "replace": "b"}
    moved = {**retarget, "find": "c", "replace": "d"}
    assert worst(classify({"mutants": [retarget]}, {"mutants": [moved]})) == "KEPT"
    assert worst(classify({"mutants": [retarget]}, {"mutants": []})) == "BREAKING"
    init = {"object": "m:C", "kind": "class", "methods": {"__init__": "(self, n: int)"}}
    typed = {**init, "methods": {"__init__": "(self, n: int) -> None"}}
    assert classify({"api": [init]}, {"api": [typed]}) == []  # __init__ returns None either way
    other = {**init, "methods": {"run": "(self)"}}
    assert (
        worst(
            classify({"api": [other]}, {"api": [{**other, "methods": {"run": "(self) -> None"}}]})
        )
        == "BREAKING"
    )


def test_an_oracle_added_is_additive_and_one_taken_away_breaking() -> None:
    driver = {"driver": "specs/s/s_oracle.py:calls"}
    ref = {**driver, "references": {"m": "specs/s/s_ref.py"}, "reference_calls": ["v2/*"]}
    assert worst(classify({}, {"oracle": driver})) == "ADDITIVE"
    assert worst(classify({"oracle": driver}, {"oracle": ref})) == "ADDITIVE"
    assert worst(classify({"oracle": ref}, {"oracle": driver})) == "BREAKING"
    assert worst(classify({"oracle": driver}, {})) == "BREAKING"
    moved = {"driver": "specs/s/other.py:calls"}
    assert worst(classify({"oracle": driver}, {"oracle": moved})) == "BREAKING"
    assert classify({"oracle": ref}, {"oracle": dict(ref)}) == []
    rule = {"id": "r", "kind": "forbidden_ops", "driver": "specs/s/d.py:f", "ops": ["aten::x"]}
    assert worst(classify({"rules": [rule]}, {"rules": [{**rule, "tests": True}]})) == "ADDITIVE"
    assert worst(classify({"rules": [{**rule, "tests": True}]}, {"rules": [rule]})) == "BREAKING"


def test_evidence_compares_definitions_not_bytes() -> None:
    base = 'X = 1\n\n\ndef test_a():\n    """Doc."""\n    assert X == 1\n'
    reflowed = 'X = 1\n\n\ndef test_a():\n    """Doc,\n    reflowed."""\n    assert X == 1  # hm\n'
    assert compare_file("t.py", base, reflowed) == []
    assert worst(compare_file("t.py", base, base + "\n\ndef test_b():\n    pass\n")) == "ADDITIVE"
    assert worst(compare_file("t.py", base, base.replace("X == 1", "True"))) == "BREAKING"
    assert worst(compare_file("t.py", base, base.replace("X = 1", "X = 2"))) == "BREAKING"
    assert worst(compare_file("t.py", base, None)) == "BREAKING"
    imports = "from m import a\nimport x\n\n\ndef test_c():\n    assert a(x)\n"
    grown = imports.replace("import a", "import a, b") + "\n\ndef test_d():\n    assert b\n"
    assert worst(compare_file("t.py", imports, grown)) == "ADDITIVE"  # a new test, b imported
    unused = imports.replace("import a", "import a, b")
    assert compare_file("t.py", imports, unused) == []  # an import nothing uses is no evidence
    swapped = imports.replace("from m import a", "from n import a")
    assert worst(compare_file("t.py", imports, swapped)) == "BREAKING"  # a loads another thing
    assert worst(compare_file("t.py", base, "def (")) == "BREAKING"


LONGHAND = """\
import importlib.util
from pathlib import Path

_SPEC = importlib.util.spec_from_file_location("kit", Path(__file__).parents[1] / "_kit" / "k.py")
assert _SPEC is not None and _SPEC.loader is not None
kit = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kit)
SCALE, ERRORS = kit.SCALE, kit.ERRORS


def _beside(name):
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def calls(o):
    kit.sweep(o, SCALE, ERRORS)
    _beside("s_domain").calls(o)
"""
IMPORTED = """\
import s_domain
from speckit import k as kit
from speckit.k import ERRORS, SCALE


def calls(o):
    kit.sweep(o, SCALE, ERRORS)
    s_domain.calls(o)
"""


def test_a_load_by_path_and_an_import_of_the_same_file_are_the_same_evidence() -> None:
    """The kit file moved (``specs/_kit/k.py`` -> ``specs/_kit/speckit/k.py``, as git
    pairs it) and every load by path turned into an import: nothing changed."""
    renames = {"specs/_kit/k.py": "specs/_kit/speckit/k.py"}
    path = "specs/s/s_oracle.py"
    assert compare_file(path, LONGHAND, IMPORTED, renames) == []
    unmoved = compare_file(path, LONGHAND, IMPORTED)  # without the rename: another file
    assert [c.level for c in unmoved] == ["BREAKING"] * 3, unmoved
    other = IMPORTED.replace("import s_domain", "import s_other as s_domain")
    changes = compare_file(path, LONGHAND, other, renames)
    assert worst(changes) == "BREAKING"
    assert "s_domain loads file:specs/s/s_other.py, was file:specs/s/s_domain.py" in str(changes)
    edited = IMPORTED.replace("s_domain.calls(o)", "s_domain.calls(None)")
    assert worst(compare_file(path, LONGHAND, edited, renames)) == "BREAKING"


def test_a_module_and_a_package_of_its_own_have_one_import_name() -> None:
    assert import_name("niels_gpt/model/rope.py") == "niels_gpt.model.rope"
    assert import_name("niels_gpt/model/rope/__init__.py") == "niels_gpt.model.rope"
    assert import_name("niels_gpt/model/_x/__init__.py") == "niels_gpt.model._x"


# --- a package's code moved out of its __init__.py (issue 31, named modules) ----------
