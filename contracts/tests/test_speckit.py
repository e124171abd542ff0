"""The maintainers' spec kit (``specs/_kit/``) is evidence of every stage that loads it.

A kit edit must name each stage whose spec-side files load it and is
classified for each like an edit of its own tests; a verdict writes the
base's kit beside the acceptance tests and beside the runtime-rule drivers;
a user's tests reach what the kit imports, in the closure and in the device
reports' keys.
"""

from __future__ import annotations

from pathlib import Path

from gatekit import Repo, rules
from test_closure import Texts

from niels_gpt_contracts import fingerprint
from niels_gpt_contracts.checks import importers, speckit
from niels_gpt_contracts.checks.loading import load_specs
from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree
from niels_gpt_contracts.verdict import files, plan

ROOT = Path(__file__).resolve().parents[2]
KIT = "specs/_kit/speckit.py"
SWEEPS = "specs/_kit/speckit_sweeps.py"
KIT_TEXT = "def length(x):\n    return len(x)\n"
ACCEPT = "specs/alpha/tests/test_accept.py"
LOADER = """\
import importlib.util
from pathlib import Path

import pytest

from ngx.alpha_mod import rotate

_SPEC = importlib.util.spec_from_file_location("kit", Path(__file__).parents[2] / "_kit/speckit.py")
kit = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(kit)


@pytest.mark.invariant("alpha.keeps_length")
def test_accept_length():
    assert kit.length(rotate([1.0, 2.0, 3.0])) == 3
"""


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


def test_a_kit_edit_names_every_stage_that_loads_it(repo: Repo) -> None:
    repo.write(KIT, KIT_TEXT)
    repo.write(ACCEPT, LOADER)
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
    assert "changes the spec kit 'alpha' loads without a 'Spec: alpha' trailer" in str(out)

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


def test_a_kit_no_stage_loads_needs_no_stage_named(repo: Repo) -> None:
    repo.write(KIT, KIT_TEXT)
    code, out = _amend(repo, "1.0.0 1.0.0", "Spec: alpha")
    assert code == 0, out
    assert KIT not in _summary(out, "alpha")


def test_what_a_driver_loads_reaches_what_that_kit_file_loads() -> None:
    kit = {
        "specs/_kit/speckit_a.py": "# loads speckit_b\n",
        "specs/_kit/speckit_b.py": "# loads speckit_c\n",
        "specs/_kit/speckit_c.py": "import torch\n",
        "specs/_kit/speckit_d.py": "# loads speckit_a\n",  # loads what names it: no reach back
    }
    assert speckit.named_by(["load(speckit_a)"], kit) == [
        "specs/_kit/speckit_a.py",
        "specs/_kit/speckit_b.py",
        "specs/_kit/speckit_c.py",
    ]
    assert speckit.named_by(["load(speckit_c)"], kit) == ["specs/_kit/speckit_c.py"]
    assert speckit.named_by(["speckit_ab"], kit) == []  # a whole word, not a prefix


def test_users_are_the_stages_whose_spec_side_files_name_it() -> None:
    tree = Texts(
        {
            KIT: "from niels_gpt.model.fastpath import use_fast_attention\n",
            SWEEPS: "import torch\nfrom niels_gpt.model.rope import apply_rope\n",
            "specs/kv_cache/tests/_kit.py": 'KIT = "speckit.py"\n',
            "specs/padding/padding_oracle.py": "import torch\n",
            "specs/rope/tests/test_x.py": "# speckit.md is prose, yet it names the kit\n",
            "specs/attention/attention_oracle_domain.py": 'KIT = "speckit_sweeps.py"\n',
            "packages/padding/tests/test_speckit_like.py": "speckit\n",  # not spec-side
        }
    )
    stages = ["attention", "kv_cache", "padding", "rope"]
    assert speckit.users(tree, stages, KIT) == {"kv_cache", "rope"}
    assert speckit.users(tree, stages, SWEEPS) == {"attention"}  # one kit file, its own users
    assert speckit.kit_files(tree.files()) == [KIT, SWEEPS]
    specs = load_specs(WorkingTree(GitRepo(ROOT)))
    uses = importers.uses(specs, tree)
    assert "fastpath" in uses["kv_cache"] and "fastpath" in uses["rope"]  # through the kit
    assert "fastpath" not in uses.get("padding", set())
    assert uses["attention"] == {"rope"}  # what the sweeps import, not what speckit.py does


def test_a_kit_file_edit_names_the_stages_that_load_that_file(repo: Repo) -> None:
    repo.write(KIT, KIT_TEXT)
    repo.write(SWEEPS, KIT_TEXT)
    repo.write(ACCEPT, LOADER)
    code, out = _amend(repo, "1.0.0 1.1.0", "Spec: alpha")
    assert code == 0, out
    repo.git("branch", "-f", "main", "HEAD")

    repo.replace(SWEEPS, "return len(x)", "return 3")  # alpha loads speckit.py alone
    repo.replace("specs/beta.toml", 'title = "Beta stage"', 'title = "Beta"')
    repo.commit("edit the sweeps no stage loads\n\nSpec: beta")
    code, out = repo.gate_json("--no-api", "--base", "main", "--head", "HEAD")
    assert code == 0, out
    assert ("amendment.trailer", SWEEPS) not in rules(out)

    repo.git("reset", "-q", "--hard", "main")
    repo.write("specs/_kit/lengths.json", "[3]\n")  # a table only speckit.py names
    repo.replace(KIT, "return len(x)", "return len(x)  # lengths.json")
    repo.commit("a table for the kit\n\nSpec: alpha")
    repo.git("branch", "-f", "main", "HEAD")
    repo.write("specs/_kit/lengths.json", "[4]\n")
    repo.replace("specs/beta.toml", 'title = "Beta stage"', 'title = "Beta"')
    repo.commit("edit the table alpha's kit reads\n\nSpec: beta")
    code, out = repo.gate_json("--no-api", "--base", "main", "--head", "HEAD")
    assert code == 1  # named from inside the kit only, it is still alpha's
    assert ("amendment.trailer", "specs/_kit/lengths.json") in rules(out)

    repo.git("reset", "-q", "--hard", "main")
    repo.replace(ACCEPT, "speckit.py", "speckit_sweeps.py")  # alpha now loads the sweeps
    repo.replace(SWEEPS, "return len(x)", "return 3")
    repo.replace("specs/beta.toml", 'title = "Beta stage"', 'title = "Beta"')
    repo.commit("edit the sweeps alpha loads\n\nSpec: beta")
    code, out = repo.gate_json("--no-api", "--base", "main", "--head", "HEAD")
    assert code == 1
    assert "changes the spec kit 'alpha' loads without a 'Spec: alpha' trailer" in str(out)


def test_a_verdict_writes_the_bases_kit_beside_the_acceptance_tests() -> None:
    specs = load_specs(WorkingTree(GitRepo(ROOT)))
    base = ["specs/padding/tests/_kit.py", "specs/padding/tests/test_loss.py", KIT]
    made = plan.make_plan(specs["padding"], specs, [], base, base, set())
    assert KIT in made.reference_from_base
    assert KIT not in made.reference_targets  # loaded by the tests, never collected


def test_a_verdict_writes_the_bases_kit_beside_the_drivers() -> None:
    specs = load_specs(WorkingTree(GitRepo(ROOT)))
    base = [
        "specs/padding/padding_runtime.py",
        "specs/padding/tests/test_loss.py",
        "specs/quant/quant_runtime.py",  # not in padding's closure
        KIT,
    ]
    made = plan.make_plan(specs["padding"], specs, [], base, base, set())
    assert files.driver_files(made, base) == ["specs/padding/padding_runtime.py", KIT]


def test_a_device_report_key_follows_the_kit_where_it_is_loaded(repo: Repo) -> None:
    repo.write(KIT, "from ngx import beta_mod\n")
    before = fingerprint.stage_keys(repo.root)
    repo.replace(KIT, "\n", "\n# edited\n")
    edited = fingerprint.stage_keys(repo.root)
    assert edited == before  # no acceptance test loads it yet
    repo.write(ACCEPT, LOADER)
    loaded = fingerprint.stage_keys(repo.root)
    repo.replace(KIT, "# edited\n", "# edited again\n")
    again = fingerprint.stage_keys(repo.root)
    assert again["alpha"] != loaded["alpha"]  # alpha's tests load the kit
    repo.replace("packages/beta/src/ngx/beta_mod.py", "def use(", "# a comment\ndef use(")
    assert fingerprint.stage_keys(repo.root)["alpha"] != again["alpha"]  # what the kit imports
