"""Module ownership and readable source: what a stage ships and what it imports."""

from __future__ import annotations

import pytest
from gatekit import Repo, rules

PR = ("--stage", "beta", "--base", "main", "--head", "HEAD", "--no-api")
BETA_MOD = "packages/beta/src/ngx/beta_mod.py"


def test_the_template_keeps_every_ownership_rule(repo: Repo) -> None:
    code, out = repo.gate_json("--no-api")
    assert code == 0, out["violations"]


def test_a_module_shadowing_another_stage_is_named(repo: Repo) -> None:
    repo.write("packages/beta/src/ngx/alpha_mod.py", "def rotate(x):\n    return x\n")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert rules(out) == {("module.shadowed", "packages/beta/src/ngx/alpha_mod.py")}
    assert "stage 'alpha' owns" in out["violations"][0]["message"]


def test_a_package_of_the_same_name_shadows_a_module(repo: Repo) -> None:
    """``ngx/alpha_mod/__init__.py`` is imported as ``ngx.alpha_mod`` too (PEP 561 layout)."""
    repo.write("packages/beta/src/ngx/alpha_mod/__init__.py", "def rotate(x):\n    return x\n")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert rules(out) == {("module.shadowed", "packages/beta/src/ngx/alpha_mod/__init__.py")}
    assert "shadows ngx/alpha_mod.py, which stage 'alpha' owns" in out["violations"][0]["message"]


@pytest.mark.parametrize("extra", ["ngx/helpers.py", "ngx/__init__.py", "evil.pth", "ngx/data.bin"])
def test_a_file_the_spec_does_not_list_is_named(repo: Repo, extra: str) -> None:
    repo.write(f"packages/beta/src/{extra}", "x = 1\n")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert ("module.unlisted", f"packages/beta/src/{extra}") in rules(out)


def test_py_typed_is_always_allowed(repo: Repo) -> None:
    repo.write("packages/beta/src/ngx/py.typed", "")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 0, out["violations"]


def test_a_listed_module_that_is_gone_is_named(repo: Repo) -> None:
    repo.delete(BETA_MOD)
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert ("module.missing", "specs/beta.toml") in rules(out)


@pytest.mark.parametrize(
    "line",
    [
        "import ngx.gamma_mod\n",
        "from ngx import gamma_mod\n",
        "def lazy():\n    from ngx.gamma_mod import fast\n    return fast\n",
    ],
)
def test_importing_a_stage_outside_depends_on_fails(repo: Repo, line: str) -> None:
    repo.git("checkout", "-q", "main")
    repo.write(
        "specs/gamma.toml",
        repo.read("specs/alpha.toml")
        .replace('id = "alpha"', 'id = "gamma"')
        .replace('"packages/alpha"', '"packages/gamma"')
        .replace("ngx-alpha", "ngx-gamma")
        .replace("ngx/alpha_mod.py", "ngx/gamma_mod.py")
        .replace("alpha.", "gamma.")
        .replace("packages/alpha/", "packages/gamma/"),
    )
    repo.write("packages/gamma/pyproject.toml", "[project]\nname = 'ngx-gamma'\n")
    repo.commit("a gamma stage on main")
    repo.git("checkout", "-q", "pr")
    repo.git("merge", "-q", "main")
    repo.write(BETA_MOD, repo.read(BETA_MOD) + line)
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    found = [v for v in out["violations"] if v["rule"] == "module.undeclared-import"]
    assert len(found) == 1, out["violations"]
    assert "owned by stage 'gamma'" in found[0]["message"]


def test_importing_a_module_no_stage_owns_fails(repo: Repo) -> None:
    repo.write(BETA_MOD, repo.read(BETA_MOD) + "import ngx.nowhere\n")
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    assert ("module.undeclared-import", BETA_MOD) in rules(out)


@pytest.mark.parametrize(
    ("code_line", "rule"),
    [
        ("import importlib\n", "source.import"),
        ("import sys\n", "source.import"),
        ("from torch.utils import cpp_extension\n", "source.import"),
        ("from torch import _C\n", "source.import"),
        ('f = getattr(alpha_mod, "ro" + "tate")\n', "source.dynamic"),
        ('f = globals()["alpha_mod"]\n', "source.dynamic"),
        ('f = alpha_mod.__dict__["rotate"]\n', "source.dynamic"),
        ("use.__signature__ = None\n", "source.dynamic"),
        ('exec("x = 1")\n', "source.dynamic"),
        ("m = alpha_mod.sys\n", "source.dynamic"),
        ('__import__("os")\n', "source.dynamic"),
        (
            'import functools\nf = functools.reduce(getattr, ("rotate",), alpha_mod)\n',
            "source.dynamic",
        ),
        ("import torch\nf = torch.load\n", "source.dynamic"),
        ("def dump(x):\n    x.tofile('/tmp/x')\n", "source.dynamic"),
        ("import torch\nk = torch._C\n", "source.dynamic"),
        ("import torch.nn.functional as F\nk = F._canonical_mask\n", "source.dynamic"),
        ("class Box:\n    def __call__(self):\n        return 1\n", "source.dynamic"),
        ("import warnings\n", "source.import"),
        ("def under_test(w):\n    return w.filters\n", "source.dynamic"),
        ("def call(m, x):\n    return m._call_impl(x)\n", "source.dynamic"),
        ("import torch\nk = torch.ops.aten.mm\n", "source.dynamic"),
        ("import torch as t\nk = t.ops.aten._weight_int8pack_mm\n", "source.dynamic"),
        ("import torch\nk = torch.ops\n", "source.dynamic"),
    ],
)
def test_unreadable_source_is_named_with_its_line(repo: Repo, code_line: str, rule: str) -> None:
    before = repo.read(BETA_MOD)
    repo.write(BETA_MOD, before + code_line)
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 1
    added = range(before.count("\n") + 1, before.count("\n") + 1 + code_line.count("\n"))
    found = {(v["rule"], v["path"], v["line"]) for v in out["violations"]}
    assert any((rule, BETA_MOD, line) in found for line in added), out["violations"]


def test_an_allowed_aten_op_by_its_literal_name_is_readable(repo: Repo) -> None:
    repo.write(
        BETA_MOD,
        repo.read(BETA_MOD)
        + "\n\nimport torch\n\n\ndef fused(x: torch.Tensor, q: torch.Tensor, s: torch.Tensor):\n"
        + "    return torch.ops.aten._weight_int8pack_mm(x, q, s)\n",
    )
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 0, out["violations"]


def test_literal_getattr_and_own_attributes_are_readable(repo: Repo) -> None:
    repo.write(
        BETA_MOD,
        repo.read(BETA_MOD)
        + "\n\nclass Box:\n    size = 1\n\n    def get(self, name: str) -> object:\n"
        + '        return getattr(self, name), getattr(alpha_mod, "rotate"), self.__class__\n',
    )
    repo.commit()
    code, out = repo.gate_json(*PR)
    assert code == 0, out["violations"]
