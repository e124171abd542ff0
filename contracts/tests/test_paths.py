"""Path rules of the PR gate, on real temporary git repositories."""

from __future__ import annotations

from gatekit import Repo, rules

GATE = ("--no-api",)


def test_compliant_pr_passes(repo: Repo) -> None:
    repo.replace("packages/alpha/src/ngx/alpha_mod.py", "n = turns", "n = int(turns)")
    repo.write("packages/alpha/README.md", "alpha\n")
    repo.commit()
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "HEAD", *GATE)
    assert code == 0, out["violations"]
    assert out["ok"] is True
    assert out["violations"] == []


def test_path_outside_allowlist_fails(repo: Repo) -> None:
    repo.write("README.md", "# edited\n")
    repo.commit()
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "HEAD", *GATE)
    assert code == 1
    assert out["ok"] is False
    assert rules(out) == {("path.not-allowed", "README.md")}
    assert out["violations"][0]["line"] is None


def test_must_not_change_fails(repo: Repo) -> None:
    repo.write("packages/beta/src/ngx/extra.py", "X = 1\n")
    repo.commit()
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "HEAD", *GATE)
    assert code == 1
    assert rules(out) == {("path.forbidden", "packages/beta/src/ngx/extra.py")}


def test_meta_change_fails_every_stage(repo: Repo) -> None:
    repo.write("noxfile.py", "# sessions, edited\n")
    repo.write("noxkit/devenv.py", "# the dev env, edited\n")
    repo.write("contracts/x.py", "\n")
    repo.write(".github/workflows/ci.yml", "on: push\n")
    repo.commit()
    for stage in ("alpha", "beta"):
        code, out = repo.gate_json("--stage", stage, "--base", "main", "--head", "HEAD", *GATE)
        assert code == 1
        assert rules(out) == {
            ("path.meta", "noxfile.py"),
            ("path.meta", "noxkit/devenv.py"),
            ("path.meta", "contracts/x.py"),
            ("path.meta", ".github/workflows/ci.yml"),
        }


def test_nested_pyproject_is_not_meta(repo: Repo) -> None:
    repo.replace("packages/alpha/pyproject.toml", 'version = "0.1.0"', 'version = "0.1.1"')
    repo.commit()
    code, _ = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "HEAD", *GATE)
    assert code == 0


def test_pr_widening_its_own_spec_fails(repo: Repo) -> None:
    repo.replace("specs/alpha.toml", 'may_change = ["packages/alpha/**"]', 'may_change = ["**"]')
    repo.write("README.md", "# edited\n")
    repo.commit()
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "HEAD", *GATE)
    assert code == 1
    # The spec comes from the base: README is still outside the allowlist.
    assert rules(out) == {("path.meta", "specs/alpha.toml"), ("path.not-allowed", "README.md")}


def test_rename_from_allowed_into_forbidden(repo: Repo) -> None:
    repo.git("mv", "packages/alpha/src/ngx/alpha_mod.py", "packages/beta/src/ngx/alpha_mod.py")
    repo.commit()
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "HEAD", *GATE)
    assert code == 1
    bad = [v for v in out["violations"] if v["rule"].startswith("path.")]
    assert [(v["rule"], v["path"]) for v in bad] == [
        ("path.forbidden", "packages/beta/src/ngx/alpha_mod.py")
    ]
    assert "renamed from 'packages/alpha/src/ngx/alpha_mod.py'" in bad[0]["message"]


def test_deleting_a_forbidden_file_fails(repo: Repo) -> None:
    repo.delete("packages/beta/tests/test_beta.py")
    repo.commit()
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "HEAD", *GATE)
    assert code == 1
    paths = [v for v in out["violations"] if v["rule"] == "path.forbidden"]
    assert [v["path"] for v in paths] == ["packages/beta/tests/test_beta.py"]
    assert paths[0]["message"].startswith("deleted")


def test_file_turned_into_symlink_fails(repo: Repo) -> None:
    repo.symlink("packages/beta/pyproject.toml", "../alpha/pyproject.toml")
    repo.commit()
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "HEAD", *GATE)
    assert code == 1
    forbidden = [v for v in out["violations"] if v["rule"] == "path.forbidden"]
    assert [v["path"] for v in forbidden] == ["packages/beta/pyproject.toml"]
    assert "symlink" in forbidden[0]["message"]


def test_paths_with_spaces_newlines_and_non_ascii(repo: Repo) -> None:
    allowed = "packages/alpha/docs/a b/ünïcødé näme.md"
    forbidden = "packages/beta/we ird\nname ✓.txt"
    repo.write(allowed, "ok\n")
    repo.write(forbidden, "no\n")
    repo.commit()
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "HEAD", *GATE)
    assert code == 1
    assert rules(out) == {("path.forbidden", forbidden)}


def test_working_tree_mode_sees_untracked_and_uncommitted(repo: Repo) -> None:
    repo.write("packages/beta/new file.py", "X = 1\n")  # untracked
    repo.replace("README.md", "# ngx", "# ngx!")  # uncommitted
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", *GATE)
    assert code == 1
    assert rules(out) == {
        ("path.forbidden", "packages/beta/new file.py"),
        ("path.not-allowed", "README.md"),
    }


def test_changes_are_counted_from_the_merge_base(repo: Repo) -> None:
    repo.write("packages/alpha/notes.md", "pr\n")
    repo.commit("pr work")
    repo.git("checkout", "-q", "main")
    repo.write("README.md", "# main moved on\n")  # not the PR's change
    repo.commit("main work")
    repo.git("checkout", "-q", "pr")
    code, out = repo.gate_json("--stage", "alpha", "--base", "main", "--head", "pr", *GATE)
    assert code == 0, out["violations"]
    assert out["changed_paths"] == 1
