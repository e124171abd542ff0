"""Static rules, in the PR gate (on the head) and in the tree check."""

from __future__ import annotations

from gatekit import Repo, rules

ALPHA = ("--stage", "alpha", "--base", "main", "--head", "HEAD", "--no-api")
BETA = ("--stage", "beta", "--base", "main", "--head", "HEAD", "--no-api")
ALPHA_MOD = "packages/alpha/src/ngx/alpha_mod.py"
BETA_MOD = "packages/beta/src/ngx/beta_mod.py"


def located(out: dict[str, object]) -> list[tuple[str, str, int | None]]:
    return [(v["rule"], v["path"], v["line"]) for v in out["violations"]]  # type: ignore[attr-defined]


def test_import_as_module_compliant_variant_passes(repo: Repo) -> None:
    repo.replace(BETA_MOD, "import ngx.alpha_mod as alpha_mod", "from ngx import alpha_mod")
    repo.commit()
    code, out = repo.gate_json(*BETA)
    assert code == 0, out["violations"]


def test_from_import_breaks_import_as_module(repo: Repo) -> None:
    repo.replace(BETA_MOD, "import ngx.alpha_mod as alpha_mod", "from ngx.alpha_mod import rotate")
    repo.replace(BETA_MOD, "alpha_mod.rotate(x)", "rotate(x)")
    repo.commit()
    code, out = repo.gate_json(*BETA)
    assert code == 1
    found = located(out)
    assert ("static.alpha-as-module", BETA_MOD, 3) in found
    assert ("static.alpha-as-module", BETA_MOD, 9) in found
    assert any("expected a call 'alpha_mod.rotate(...)'" in v["message"] for v in out["violations"])
    # Breaches on lines the PR changed come first.
    assert out["violations"][0]["changed"] is True


def test_binding_the_attribute_breaks_import_as_module(repo: Repo) -> None:
    repo.replace(
        BETA_MOD, "    return alpha_mod.rotate(x)", "    f = alpha_mod.rotate\n    return f(x)"
    )
    repo.commit()
    code, out = repo.gate_json(*BETA)
    assert code == 1
    assert ("static.alpha-as-module", BETA_MOD, 9) in located(out)


def test_forbidden_name_fails_with_line(repo: Repo) -> None:
    repo.write(
        BETA_MOD,
        repo.read(BETA_MOD)
        + "\n\ndef fast(q):\n    import torch.nn.functional as F\n"
        + "    return F.scaled_dot_product_attention(q, q, q)\n",
    )
    repo.commit()
    code, out = repo.gate_json(*BETA)
    assert code == 1
    assert located(out) == [("static.no-sdpa", BETA_MOD, 14)]


def test_forbidden_name_ignores_docstrings(repo: Repo) -> None:
    repo.replace(
        BETA_MOD, "from __future__", '"""Never scaled_dot_product_attention."""\n\nfrom __future__'
    )
    repo.commit()
    code, out = repo.gate_json(*BETA)
    assert code == 0, out["violations"]


def test_forbidden_call_inside_function_and_its_helpers(repo: Repo) -> None:
    repo.replace(
        ALPHA_MOD,
        '        raise ValueError("empty")',
        '        raise ValueError("empty")\n    x[0].to("cpu")',
    )
    repo.commit()
    code, out = repo.gate_json(*ALPHA)
    assert code == 1
    assert located(out) == [("static.no-cast-in-rotate", ALPHA_MOD, 9)]
    assert "_check (called from rotate)" in out["violations"][0]["message"]


def test_forbidden_call_outside_the_function_is_fine(repo: Repo) -> None:
    repo.write(ALPHA_MOD, repo.read(ALPHA_MOD) + "\n\ndef other(x):\n    return x.to('cpu')\n")
    repo.replace("specs/alpha.toml", '"Thing", "rotate"', '"Thing", "rotate"')  # unchanged
    repo.commit()
    code, out = repo.gate_json(*ALPHA)
    assert code == 0, out["violations"]


def test_new_runtime_dependency_fails(repo: Repo) -> None:
    repo.replace(
        "packages/beta/pyproject.toml", '"ngx-alpha>=0.1"', '"ngx-alpha>=0.1", "Requests>=2"'
    )
    repo.commit()
    code, out = repo.gate_json(*BETA)
    assert code == 1
    assert located(out) == [("static.dependencies", "packages/beta/pyproject.toml", 4)]
    assert "Requests" in out["violations"][0]["message"]


def test_tree_check_runs_static_rules(repo: Repo) -> None:
    repo.replace(BETA_MOD, "import ngx.alpha_mod as alpha_mod", "from ngx.alpha_mod import rotate")
    code, out = repo.gate_json("--no-api")
    assert code == 1
    assert rules(out) == {("static.alpha-as-module", BETA_MOD)}
    assert out["stages"] == {"alpha": "KEPT", "beta": "BROKEN"}
