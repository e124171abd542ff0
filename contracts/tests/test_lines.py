"""Line-scoped permissions: another stage's tests may change only to add V=."""

from __future__ import annotations

import pytest
from gatekit import Repo, rules

GATE = ("--stage", "beta", "--base", "main", "--head", "HEAD", "--no-api")
TEST = "packages/alpha/tests/test_alpha.py"


def test_adding_v_to_model_config_calls_passes(repo: Repo) -> None:
    repo.replace(TEST, "ModelConfig(T=8)", "ModelConfig(V=256, T=8)")
    repo.replace(
        TEST, "        T=8,\n        C=32,\n", "        V=256,\n        T=8,\n        C=32,\n"
    )
    repo.replace("scripts/train.py", "ModelConfig()", "ModelConfig(V=50257)")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 0, out["violations"]


def test_another_changed_line_fails_with_its_line(repo: Repo) -> None:
    repo.replace(TEST, "ModelConfig(T=8)", "ModelConfig(V=256, T=8)")
    repo.replace(TEST, "assert len(rotate([1.0, 2.0])) == 2", "assert True")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 1
    assert rules(out) == {("path.line-scope", TEST)}
    lines = [v["line"] for v in out["violations"]]
    assert lines == [10]


def test_changing_other_arguments_of_the_call_fails(repo: Repo) -> None:
    repo.replace(TEST, "ModelConfig(T=8)", "ModelConfig(V=256, T=16)")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 1
    assert [(v["rule"], v["path"], v["line"]) for v in out["violations"]] == [
        ("path.line-scope", TEST, 9)
    ]


def test_same_line_smuggling_fails(repo: Repo) -> None:
    repo.replace(TEST, "cfg = ModelConfig(T=8)", "cfg = ModelConfig(V=1, T=8); import os")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 1
    assert [v["line"] for v in out["violations"]] == [9]


def test_new_test_file_outside_the_stage_fails(repo: Repo) -> None:
    repo.write("packages/alpha/tests/test_new.py", "from ngx.config import ModelConfig\n")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 1
    assert rules(out) == {("path.line-scope", "packages/alpha/tests/test_new.py")}


def test_must_not_change_wins_over_the_line_scope(repo: Repo) -> None:
    repo.write("packages/alpha/src/ngx/tests/test_x.py", "ModelConfig(V=1)\n")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 1
    assert rules(out) == {("path.forbidden", "packages/alpha/src/ngx/tests/test_x.py")}


def test_symlinked_scoped_file_fails(repo: Repo) -> None:
    repo.symlink("scripts/train.py", "../README.md")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 1
    assert rules(out) == {
        ("path.line-scope", "scripts/train.py"),
        ("path.symlink", "scripts/train.py"),
    }


def test_added_v_may_be_a_module_level_int_constant(repo: Repo) -> None:
    repo.git("checkout", "-q", "main")
    repo.replace(TEST, "import pytest\n", "import pytest\n\nVOCAB = 256\n")
    repo.commit("a constant on main")
    repo.git("checkout", "-q", "pr")
    repo.git("merge", "-q", "main")
    repo.replace(TEST, "ModelConfig(T=8)", "ModelConfig(V=VOCAB, T=8)")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 0, out["violations"]


def test_added_v_naming_a_rebound_constant_fails(repo: Repo) -> None:
    repo.git("checkout", "-q", "main")
    repo.replace(TEST, "import pytest\n", "import pytest\n\nVOCAB = 256\nVOCAB = 512\n")
    repo.commit("a constant bound twice on main")
    repo.git("checkout", "-q", "pr")
    repo.git("merge", "-q", "main")
    repo.replace(TEST, "ModelConfig(T=8)", "ModelConfig(V=VOCAB, T=8)")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 1
    assert "must be an int literal" in out["violations"][0]["message"]


@pytest.mark.parametrize(
    "value",
    [
        '(__import__("pathlib").Path("x").write_text("y") and 256)',
        "len([1] * 256)",
        "True",
        "256.0",
        "-256",
        "VOCAB",
    ],
)
def test_added_v_that_is_not_an_int_literal_fails(repo: Repo, value: str) -> None:
    repo.replace("scripts/train.py", "ModelConfig()", f"ModelConfig(V={value})")
    repo.commit()
    code, out = repo.gate_json(*GATE)
    assert code == 1
    assert [(v["rule"], v["path"]) for v in out["violations"]] == [
        ("path.line-scope", "scripts/train.py")
    ]
    assert "must be an int literal" in out["violations"][0]["message"]
