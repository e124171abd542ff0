"""Code that moves as an amendment: a module into a package of its own, an ``__init__``
split into named modules behind re-exports.

A move is a ``Spec:`` amendment only when the code arrives verbatim and the
``__init__`` left behind does nothing but re-export; an edit on the way, or
an ``__init__`` that does more, is code the amendment may not carry. Every
case is a real commit range in ``gatekit``'s alpha/beta monorepo, judged by
``contracts check --base main --head HEAD``.
"""

from __future__ import annotations

import pytest
from amendkit import ALPHA, amend, judge, row
from gatekit import Repo, rules

from niels_gpt_contracts.checks.spec_changes.reexports import reexports_only


def test_a_module_moved_into_a_package_of_its_own_is_additive(repo: Repo) -> None:
    """PEP 561 per stage: the module becomes ``ngx/alpha_mod/__init__.py`` with its own
    ``py.typed``, content unchanged; the spec lists the new path (a minor bump)."""
    repo.git("mv", "packages/alpha/src/ngx/alpha_mod.py", "packages/alpha/src/ngx/alpha_mod.tmp")
    repo.root.joinpath("packages/alpha/src/ngx/alpha_mod").mkdir()
    repo.git(
        "mv", "packages/alpha/src/ngx/alpha_mod.tmp", "packages/alpha/src/ngx/alpha_mod/__init__.py"
    )
    repo.write("packages/alpha/src/ngx/alpha_mod/py.typed", "")
    amend(
        repo, 'modules = ["ngx/alpha_mod.py"]', 'modules = ["ngx/alpha_mod/__init__.py"]', "1.1.0"
    )
    code, out = judge(repo)
    assert code == 0, out
    assert row(out)["summary"].startswith(
        "ADDITIVE 1.0.0 -> 1.1.0: module +ngx/alpha_mod/__init__.py"
    )
    code, out = repo.gate_json("--no-api")  # the tree: the moved module is owned, imports resolve
    assert code == 0, out["violations"]


def test_a_move_that_edits_the_code_is_not_an_amendment(repo: Repo) -> None:
    repo.root.joinpath("packages/alpha/src/ngx/alpha_mod").mkdir()
    repo.git(
        "mv", "packages/alpha/src/ngx/alpha_mod.py", "packages/alpha/src/ngx/alpha_mod/__init__.py"
    )
    repo.replace("packages/alpha/src/ngx/alpha_mod/__init__.py", "n = turns % len(x)", "n = 0")
    repo.write("packages/alpha/src/ngx/alpha_mod/py.typed", "not empty\n")
    amend(
        repo, 'modules = ["ngx/alpha_mod.py"]', 'modules = ["ngx/alpha_mod/__init__.py"]', "1.1.0"
    )
    code, out = judge(repo)
    assert code == 1
    found = rules(out)
    assert ("amendment.path", "packages/alpha/src/ngx/alpha_mod/__init__.py") in found
    assert ("amendment.path", "packages/alpha/src/ngx/alpha_mod/py.typed") in found


PKG = "packages/alpha/src/ngx/alpha_mod"
REEXPORT = (
    '"""Alpha: the code is in ``core``."""\n\nfrom __future__ import annotations\n\n'
    'from ngx.alpha_mod.core import Thing, rotate\n\n__all__ = ["Thing", "rotate"]\n'
)


def _alpha_as_a_package_on_main(repo: Repo) -> None:
    """Main's alpha module becomes ``ngx/alpha_mod/__init__.py``; the PR branch restarts there."""
    repo.git("checkout", "-q", "main")
    repo.root.joinpath(PKG).mkdir()
    repo.git("mv", "packages/alpha/src/ngx/alpha_mod.py", f"{PKG}/__init__.py")
    repo.write(f"{PKG}/py.typed", "")
    repo.replace(ALPHA, 'modules = ["ngx/alpha_mod.py"]', 'modules = ["ngx/alpha_mod/__init__.py"]')
    repo.commit("alpha: a package of its own")
    repo.git("checkout", "-q", "-B", "pr", "main")


def _split(repo: Repo, init: str = REEXPORT, named: str | None = None) -> None:
    code = repo.read(f"{PKG}/__init__.py")
    repo.write(f"{PKG}/core.py", code if named is None else named)
    repo.write(f"{PKG}/__init__.py", init)
    amend(
        repo,
        'modules = ["ngx/alpha_mod/__init__.py"]',
        'modules = ["ngx/alpha_mod/__init__.py", "ngx/alpha_mod/core.py"]',
        "1.1.0",
    )


def test_code_moved_verbatim_out_of_an_init_into_a_named_module_is_an_amendment(
    repo: Repo,
) -> None:
    _alpha_as_a_package_on_main(repo)
    _split(repo)
    code, out = judge(repo)
    assert code == 0, out
    assert row(out)["summary"].startswith("ADDITIVE 1.0.0 -> 1.1.0: module +ngx/alpha_mod/core.py")
    code, out = repo.gate_json()  # the tree, API included: the package exports core's code
    assert code == 0, out["violations"]


def test_a_split_that_edits_the_code_is_not_an_amendment(repo: Repo) -> None:
    _alpha_as_a_package_on_main(repo)
    edited = repo.read(f"{PKG}/__init__.py").replace("n = turns % len(x)", "n = 0")
    _split(repo, named=edited)
    code, out = judge(repo)
    assert code == 1
    found = rules(out)
    assert ("amendment.path", f"{PKG}/__init__.py") in found
    assert ("amendment.path", f"{PKG}/core.py") in found


@pytest.mark.parametrize(
    "extra",
    [
        "print('imported')\n",
        "import os\n",
        "from os import path\n",
        "from ngx.beta_mod import use\n",
        "if True:\n    from ngx.alpha_mod.core import rotate\n",
        "def rotate(x):\n    return x\n",
    ],
)
def test_an_init_that_does_more_than_reexport_is_not_an_amendment(repo: Repo, extra: str) -> None:
    _alpha_as_a_package_on_main(repo)
    _split(repo, init=REEXPORT + extra)
    code, out = judge(repo)
    assert code == 1
    assert ("amendment.path", f"{PKG}/__init__.py") in rules(out)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('"""Doc."""\nfrom __future__ import annotations\nfrom p.q.m import a, b\n', True),
        ("from .m import a\n__all__ = ['a']\n", True),
        ("from p.q.m import a as a\n__all__ = ('a',)\n", True),
        ("from p.q.m import *\n", False),
        ("from p.q.m import a as b\n", False),
        ("from p.q.m.deeper import a\n", False),
        ("from p.q import m\n", False),
        ("from p.qx.m import a\n", False),
        ("from ..m import a\n", False),
        ("from . import m\n", False),
        ("import p.q.m\n", False),
        ("from p.q.m import a\n__all__ = ['a']\n__all__ = ['a']\n", False),
        ("from p.q.m import a\n__all__ = ['a'] + []\n", False),
        ("from p.q.m import a\n__all__: list[str] = ['a']\n", False),
        ("x = 1\n", False),
        ("from p.q.m import (\n", False),
        (None, False),
    ],
)
def test_what_counts_as_reexporting_only(text: str | None, expected: bool) -> None:
    assert reexports_only(text, "p.q") is expected
