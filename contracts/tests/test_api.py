"""The import-based API check (the modules here need no torch)."""

from __future__ import annotations

from gatekit import Repo

ALPHA_MOD = "packages/alpha/src/ngx/alpha_mod.py"
PR = ("--stage", "alpha", "--base", "main", "--head", "HEAD")


def api_violations(out: dict[str, object]) -> list[dict[str, object]]:
    return [v for v in out["violations"] if v["check"] == "api"]  # type: ignore[attr-defined,index]


def test_tree_api_matches(repo: Repo) -> None:
    code, out = repo.gate_json()
    assert code == 0, out["violations"]
    assert {o["check"] for o in out["outcomes"]} == {
        "spec",
        "api",
        "modules",
        "source",
        "static",
        "invariants",
        "stages",
    }


def test_string_annotation_spelling_does_not_matter(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "label: str | None = None", "label: 'str|None' = None")
    code, out = repo.gate_json()
    assert code == 0, out["violations"]


def test_changed_default_fails_in_pr_gate(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "turns: int = 1,", "turns: int = 2,")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    (v,) = api_violations(out)
    assert v["rule"] == "api.signature"
    assert v["path"] == ALPHA_MOD
    assert v["line"] == 11
    assert "expected default 1, found 2" in str(v["message"])


def test_kind_and_annotation_changes_fail(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "*, turns: int = 1", "turns: float = 1")
    repo.replace(ALPHA_MOD, "def run(self, x: float, *, fast", "def run(self, x: float, *, quick")
    code, out = repo.gate_json()
    assert code == 1
    messages = " | ".join(str(v["message"]) for v in api_violations(out))
    assert "parameter 'turns': expected keyword-only, found positional-or-keyword" in messages
    assert "parameter 'turns': expected annotation int, found float" in messages
    assert "run: expected parameters (self, x, fast), found (self, x, quick)" in messages


def test_missing_object_and_extra_export_fail(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "def rotate(", "def spin(")
    repo.replace(
        ALPHA_MOD,
        "    n = turns",
        "    n = turns\n    return spin(x)\n\n\ndef helper():\n    n = 0",
    )
    code, out = repo.gate_json()
    assert code == 1
    found = {v["rule"] for v in api_violations(out)}
    assert found == {"api.missing", "api.exports"}


def test_unimportable_module_is_a_violation_not_a_pass(repo: Repo) -> None:
    repo.write(ALPHA_MOD, "def rotate(:\n")
    code, out = repo.gate_json()
    assert code == 1
    v = api_violations(out)[0]
    assert v["rule"] == "api.missing"
    assert v["path"] == ALPHA_MOD
    assert v["line"] == 1


def test_pr_gate_inspects_the_head_revision_not_the_working_tree(repo: Repo) -> None:
    repo.replace(ALPHA_MOD, "turns: int = 1,", "turns: int = 2,")
    repo.commit()
    # An uncommitted fix that keeps a docstring change, so the working tree differs from main.
    repo.replace(ALPHA_MOD, "turns: int = 2,", "turns: int = 1,")
    repo.replace(ALPHA_MOD, "    _check(x)\n", '    """Rotate."""\n    _check(x)\n')
    code, _ = repo.gate_json(*PR)
    assert code == 1
    code, out = repo.gate_json("--stage", "alpha", "--base", "main")  # working tree
    assert code == 0, out["violations"]
