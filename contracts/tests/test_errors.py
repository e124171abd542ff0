"""Usage and configuration errors exit 2 with a one-line reason, never 0."""

from __future__ import annotations

from pathlib import Path

import pytest
from gatekit import Repo


def test_missing_base(repo: Repo) -> None:
    code, out, err = repo.gate("--stage", "alpha", "--base", "no-such-branch")
    assert code == 2
    assert out == ""
    assert "base revision 'no-such-branch' not found" in err


def test_unknown_stage(repo: Repo) -> None:
    code, _, err = repo.gate("--stage", "gamma", "--base", "main", "--no-api")
    assert code == 2
    assert "unknown stage 'gamma'" in err and "alpha, beta" in err
    code, _, err = repo.gate("--stage", "gamma", "--no-api")
    assert code == 2


def test_not_a_git_repository(tmp_path: Path) -> None:
    code, _, err = Repo(tmp_path).gate("--no-api")
    assert code == 2
    assert "expected a git repository" in err


def test_malformed_spec_names_file_key_and_line(repo: Repo) -> None:
    repo.replace("specs/alpha.toml", 'kind = "function"', 'kind = "funktion"')
    code, _, err = repo.gate("--no-api")
    assert code == 2
    assert "specs/alpha.toml:22: key 'api[1].kind': expected one of" in err
    assert "found str 'funktion'" in err


def test_unknown_key_and_missing_key(repo: Repo) -> None:
    repo.replace("specs/beta.toml", 'keyword = "V"', 'keyword = "V"\nkeywords = ["V"]')
    repo.replace("specs/beta.toml", 'title = "Beta stage"\n', "")
    code, _, err = repo.gate("--no-api")
    assert code == 2
    assert (
        "specs/beta.toml:20: key 'paths.line_scoped[0].keywords': expected one of the keys" in err
    )
    assert "specs/beta.toml:1: key 'title': expected this key, found it missing" in err


def test_toml_syntax_error(repo: Repo) -> None:
    repo.replace("specs/alpha.toml", 'title = "Alpha stage"', "title = ")
    code, _, err = repo.gate("--no-api")
    assert code == 2
    assert "specs/alpha.toml:5: expected TOML" in err


def test_malformed_spec_at_base_fails_the_pr_gate(repo: Repo) -> None:
    repo.git("checkout", "-q", "main")
    repo.replace("specs/alpha.toml", "schema_version = 3", "schema_version = 4")
    repo.commit("bad spec on main")
    code, _, err = repo.gate("--stage", "alpha", "--base", "main", "--head", "HEAD")
    assert code == 2
    assert "specs/alpha.toml:2: key 'schema_version'" in err


def test_spec_with_mutants_validates(repo: Repo) -> None:
    repo.write(
        "specs/alpha.toml",
        repo.read("specs/alpha.toml")
        + '\n[[mutants]]\nid = "off-by-one"\ntext = "rotate by turns+1"\n'
        + 'file = "packages/alpha/src/ngx/alpha_mod.py"\n'
        + 'find = "n = turns % len(x)"\nreplace = "n = (turns + 1) % len(x)"\n',
    )
    code, out = repo.gate_json("--no-api")
    assert code == 0, out
    [row] = [o for o in out["outcomes"] if o["check"] == "mutants"]
    assert row["summary"] == "1 mutant(s) find their text in the code", row


def test_mutant_without_a_patch_is_malformed(repo: Repo) -> None:
    repo.write(
        "specs/alpha.toml",
        repo.read("specs/alpha.toml") + '\n[[mutants]]\nid = "off-by-one"\ntext = "x"\n',
    )
    code, _, err = repo.gate("--no-api")
    assert code == 2
    assert "key 'mutants[0].file'" in err


def test_stage_from_trailer(repo: Repo) -> None:
    repo.write("packages/beta/x.md", "x\n")
    repo.git("add", "-A")
    repo.git("commit", "-q", "-m", "beta work\n\nStage: beta")
    code, out = repo.gate_json("--base", "main", "--head", "HEAD", "--no-api")
    assert code == 0, out
    assert out["stages"] == {"beta": "KEPT"}
    code, out = repo.gate_json("--base", "main", "--head", "HEAD", "--no-api", "--stage", "alpha")
    assert code == 1


def test_no_trailer_is_an_error(repo: Repo) -> None:
    repo.write("packages/beta/x.md", "x\n")
    repo.commit("no trailer")
    code, _, err = repo.gate("--base", "main", "--head", "HEAD", "--no-api")
    assert code == 2
    assert "expected a 'Stage: <id>' trailer" in err


def test_two_different_trailers_are_an_error(repo: Repo) -> None:
    for stage in ("alpha", "beta"):
        repo.write(f"packages/{stage}/x.md", "x\n")
        repo.git("add", "-A")
        repo.git("commit", "-q", "-m", f"work\n\nStage: {stage}")
    code, _, err = repo.gate("--base", "main", "--head", "HEAD", "--no-api")
    assert code == 2
    assert "expected one stage" in err and "'alpha'" in err and "'beta'" in err


@pytest.mark.parametrize(
    "args",
    [("--head", "HEAD"), ("--format", "yaml"), ("--require-device", "tpu"), ("--bogus",)],
)
def test_usage_errors_exit_2(repo: Repo, args: tuple[str, ...]) -> None:
    code, _, _ = repo.gate(*args)
    assert code == 2


def test_json_error_output_is_not_ok(repo: Repo) -> None:
    code, out = repo.gate_json("--stage", "gamma", "--no-api")
    assert code == 2
    assert out["ok"] is False
    assert "unknown stage" in out["error"]
