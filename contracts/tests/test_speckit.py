"""The spec kit (``specs/_kit/speckit/``) is evidence of every stage that declares it.

A spec names the kit modules its spec-side files import (``[oracle] kit``);
a kit edit must name each stage whose declaration reaches the file and is
classified for each like an edit of its own evidence; a spec-side import of
an undeclared kit module is refused; a verdict writes the base's declared kit
beside the acceptance tests and the drivers; a user reaches what the kit
imports, in the closure and in the device reports' keys. Nothing is decided
by searching text.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from gatekit import Repo, rules
from test_closure import Texts

from niels_gpt_contracts import fingerprint
from niels_gpt_contracts.checks.context import importers, speckit
from niels_gpt_contracts.checks.context.loading import load_specs
from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree
from niels_gpt_contracts.stagespec import Spec
from niels_gpt_contracts.verdict import files

ROOT = Path(__file__).resolve().parents[2]
INIT = "specs/_kit/speckit/__init__.py"
KIT = "specs/_kit/speckit/lengths.py"
SWEEPS = "specs/_kit/speckit/sweeps.py"
KIT_TEXT = "def length(x):\n    return len(x)\n"
ACCEPT = "specs/alpha/tests/test_accept.py"
IMPORTER = """\
import pytest
from speckit import lengths

from ngx.alpha_mod import rotate


@pytest.mark.invariant("alpha.keeps_length")
def test_accept_length():
    assert lengths.length(rotate([1.0, 2.0, 3.0])) == 3
"""
ORACLE = '\n[oracle]\ndriver = "specs/alpha/alpha_oracle.py:calls"\nkit = ["lengths"]\n'
DRIVER = "def calls(o):\n    pass\n"


def _real(kits: dict[str, tuple[str, ...]]) -> dict[str, Spec]:
    """The repository's specs, with the ``[oracle] kit`` declarations given."""
    out = dict(load_specs(WorkingTree(GitRepo(ROOT))))
    for stage, kit in kits.items():
        oracle = out[stage].oracle
        assert oracle is not None
        out[stage] = replace(out[stage], oracle=replace(oracle, kit=kit))
    return out


KITS = {
    "attention": ("module_sweeps",),
    "kv_cache": ("acceptance", "sweeps"),
    "padding": ("acceptance", "sweeps"),
    "quant": (),
}


def _declare(repo: Repo, stage: str, modules: str = '"lengths"') -> None:
    """Give ``stage``'s spec an oracle table declaring ``modules`` (a TOML list's items)."""
    text = ORACLE.replace("alpha", stage).replace('"lengths"', modules)
    repo.write(f"specs/{stage}.toml", repo.read(f"specs/{stage}.toml") + text)
    repo.write(f"specs/{stage}/{stage}_oracle.py", DRIVER)


def _amend(repo: Repo, bump: str, *trailers: str) -> tuple[int, dict[str, object]]:
    """Commit the tree with alpha's version moved as ``bump`` (``"1.0.0 1.1.0"``); judge it."""
    old, new = bump.split()
    repo.replace("specs/alpha.toml", f'version = "{old}"', f'version = "{new}"')
    repo.commit("amend\n\n" + "\n".join(trailers))
    return repo.gate_json("--no-api", "--base", "main", "--head", "HEAD")


def _summary(out: dict[str, object], stage: str) -> str:
    rows = [o for o in out["outcomes"] if o["check"] == "amendment" and o["stage"] == stage]  # type: ignore[attr-defined,index]
    assert len(rows) == 1, out
    return str(rows[0]["summary"])


def test_a_kit_edit_names_every_stage_that_declares_it(repo: Repo) -> None:
    repo.write(INIT, '"""The kit."""\n')
    repo.write(KIT, KIT_TEXT)
    repo.write(ACCEPT, IMPORTER)
    _declare(repo, "alpha")
    code, out = _amend(repo, "1.0.0 1.1.0", "Spec: alpha")
    assert code == 0, out
    assert f"{KIT} added" in _summary(out, "alpha")  # the kit counts as alpha's evidence
    repo.git("branch", "-f", "main", "HEAD")

    repo.replace(KIT, "return len(x)", "return 3")  # every list is now 3 long
    repo.replace("specs/beta.toml", 'title = "Beta stage"', 'title = "Beta"')
    repo.commit("loosen the kit under another stage's name\n\nSpec: beta")
    code, out = repo.gate_json("--no-api", "--base", "main", "--head", "HEAD")
    assert code == 1
    assert ("amendment.trailer", KIT) in rules(out)
    assert "changes the spec kit 'alpha' declares without a 'Spec: alpha' trailer" in str(out)

    repo.git("reset", "-q", "--hard", "main")
    repo.replace(KIT, "return len(x)", "return 3")
    code, out = _amend(repo, "1.1.0 1.1.0", "Spec: alpha")  # named, not declared a break
    assert code == 1
    assert ("amendment.breaking", "specs/alpha.toml") in rules(out)
    assert f"{KIT}::length edited" in str(out)
    repo.git("reset", "-q", "--hard", "main")
    repo.replace(KIT, "return len(x)", "return 3")
    code, out = _amend(repo, "1.1.0 2.0.0", "Spec: alpha", "Spec-Break: the kit's length changes")
    assert code == 0, out
    assert f"{KIT}::length edited" in _summary(out, "alpha")


def test_a_kit_file_no_spec_declares_needs_no_stage_named(repo: Repo) -> None:
    repo.write(KIT, KIT_TEXT)
    repo.write("specs/alpha/tests/test_prose.py", '"""Names speckit.lengths in prose."""\n')
    code, out = _amend(repo, "1.0.0 1.0.0", "Spec: alpha")
    assert code == 0, out
    assert KIT not in _summary(out, "alpha")  # a text naming it is no declaration


def test_a_spec_side_import_of_an_undeclared_kit_module_is_refused(repo: Repo) -> None:
    _declare(repo, "alpha", '"sweeps"')
    repo.write(INIT, '"""The kit."""\n')
    repo.write(KIT, KIT_TEXT)
    repo.write(ACCEPT, IMPORTER)  # imports lengths, which alpha does not declare
    code, out = repo.gate_json("--no-api")
    assert code == 1
    assert ("speckit.undeclared", ACCEPT) in rules(out)
    assert "imports the kit module 'lengths', expected it in [oracle] kit" in str(out)
    repo.replace("specs/alpha.toml", 'kit = ["sweeps"]', 'kit = ["sweeps", "lengths"]')
    code, out = repo.gate_json("--no-api")
    assert ("speckit.undeclared", ACCEPT) not in rules(out), out


def test_each_form_of_a_kit_import_is_read() -> None:
    source = (
        "import speckit.a\nimport speckit.b as bee\nfrom speckit import c, d as dee\n"
        "from speckit.e import f\nimport speckit\nfrom speckitx import g\n"
        "def lazy():\n    from speckit import h\n"
    )
    found = sorted(speckit.imports(source))
    assert found == [("a", 1), ("b", 2), ("c", 3), ("d", 3), ("e", 4), ("h", 8)]
    assert sorted(speckit.imports("from . import x\nfrom .y import z\n", inside_kit=True)) == [
        ("x", 1),
        ("y", 2),
    ]
    assert list(speckit.imports("from . import x\n")) == []  # relative: only inside the kit


def test_users_come_from_declarations_and_the_kits_own_imports() -> None:
    kit = {
        INIT: '"""The kit; names sweeps and lengths in prose."""\n',
        KIT: KIT_TEXT,
        SWEEPS: "import torch\n",
        "specs/_kit/speckit/module_sweeps.py": "from speckit.sweeps import errors\n",
        "specs/_kit/speckit/table.json": "[3]\n",
    }
    declared = {"attention": ["module_sweeps"], "rope": ["sweeps"], "kv_cache": ["lengths"]}
    declared["quant"] = []
    assert speckit.users(declared, SWEEPS, kit) == {"attention", "rope"}  # through module_sweeps
    assert speckit.users(declared, KIT, kit) == {"kv_cache"}
    assert speckit.users(declared, INIT, kit) == {"attention", "kv_cache", "rope"}
    assert speckit.users(declared, "specs/_kit/speckit/table.json", kit) == {
        "attention",
        "kv_cache",
        "rope",
    }
    assert speckit.users(declared, "specs/rope/rope_oracle.py", kit) == set()


def test_a_user_reaches_what_its_declared_kit_modules_import() -> None:
    tree = Texts(
        {
            "specs/_kit/speckit/acceptance.py": "from niels_gpt.model.fastpath import f\n",
            SWEEPS: "import torch\nfrom niels_gpt.model.rope import apply_rope\n",
            "specs/_kit/speckit/module_sweeps.py": "from speckit import sweeps\n",
            "specs/padding/padding_oracle.py": "import torch\n",
        }
    )
    uses = importers.uses(_real(KITS), tree)
    assert "fastpath" in uses["kv_cache"] and "fastpath" in uses["padding"]  # acceptance
    assert uses["attention"] == {"rope"}  # module_sweeps reaches the sweeps, which import rope
    assert "fastpath" not in uses.get("attention", set())
    assert "quant" not in uses  # declares no kit module


def test_a_verdict_writes_the_bases_declared_kit_beside_tests_and_drivers() -> None:
    specs = _real(KITS)
    tree = Texts(
        {
            INIT: '"""The kit."""\n',
            "specs/_kit/speckit/acceptance.py": "import torch\n",
            SWEEPS: "import torch\n",
            "specs/_kit/speckit/module_sweeps.py": "from speckit import sweeps\n",
            "specs/padding/padding_runtime.py": "from speckit import acceptance\n",
            "specs/padding/tests/test_loss.py": "import padding_kit\n",
            "specs/quant/quant_runtime.py": "import torch\n",  # not in padding's closure
        }
    )
    kit = files.kit_files(tree, [specs["padding"]])
    assert kit == [INIT, "specs/_kit/speckit/acceptance.py", SWEEPS]  # no module_sweeps
    assert files.driver_files(tree, [specs["padding"]]) == [
        "specs/padding/padding_runtime.py",
        *kit,
    ]
    assert files.kit_files(tree, [specs["attention"]]) == [
        INIT,
        "specs/_kit/speckit/module_sweeps.py",
        SWEEPS,
    ]


def test_a_device_report_key_follows_the_kit_where_it_is_declared(repo: Repo) -> None:
    repo.write(KIT, "from ngx import beta_mod\n")
    repo.write(ACCEPT, IMPORTER)
    before = fingerprint.stage_keys(repo.root)
    repo.replace(KIT, "\n", "\n# edited\n")
    assert fingerprint.stage_keys(repo.root) == before  # alpha's spec declares no kit yet
    _declare(repo, "alpha")
    declared = fingerprint.stage_keys(repo.root)
    repo.replace(KIT, "# edited\n", "# edited again\n")
    again = fingerprint.stage_keys(repo.root)
    assert again["alpha"] != declared["alpha"]  # alpha's spec declares the kit
    repo.replace("packages/beta/src/ngx/beta_mod.py", "def use(", "# a comment\ndef use(")
    assert fingerprint.stage_keys(repo.root)["alpha"] != again["alpha"]  # what the kit imports
