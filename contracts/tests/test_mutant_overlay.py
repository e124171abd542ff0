"""A mutated named module wins over the tree's copy, package and all.

A stage's code sits in a named module beside an ``__init__.py`` that re-exports
it (``niels_gpt/model/attention/causal.py``). Python finds such a module
through its package, and a regular package later on the path beats a bare
directory earlier on it, so an overlay holding only the mutated file would
never be imported: every mutant of a named module would be an error, not a
kill. The overlay therefore carries a copy of the whole package.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

from niels_gpt_contracts.mutants import zygote
from niels_gpt_contracts.mutants.catalogue import Mutant, write_overlay

ROOT = Path(__file__).resolve().parents[2]
FILE = "packages/p/src/ngo/stage/named.py"
PROBE = """
import sys
sys.path[:0] = [{overlay!r}, {src!r}]
sys.path.insert(0, {zygote_dir!r})
from zygote import check_overlay
import ngo.stage
print(ngo.stage.value, check_overlay("ngo.stage.named", {want!r}))
"""


def _mutant() -> Mutant:
    return Mutant("p", "m", "the value is off", FILE, "value = 1", "value = 2", None, "s", None)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    package = tmp_path / "packages/p/src/ngo/stage"  # ngo: a namespace, as niels_gpt is
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(
        "from ngo.stage.named import value\n\n__all__ = ['value']\n"
    )
    (package / "named.py").write_text("value = 1\n")
    (package / "py.typed").write_text("")
    return tmp_path


def _imported(tree: Path, overlay: Path, want: Path) -> str:
    code = PROBE.format(
        overlay=str(overlay),
        src=str(tree / "packages/p/src"),
        zygote_dir=str(Path(zygote.__file__).parent),
        want=str(want),
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return done.stdout.strip()


def test_the_mutated_named_module_is_the_one_imported(tree: Path) -> None:
    overlay = tree / "overlay"
    want = write_overlay(_mutant(), "value = 2\n", overlay, tree)
    assert want == overlay / "ngo/stage/named.py"
    assert (overlay / "ngo/stage/__init__.py").read_text() == (
        tree / "packages/p/src/ngo/stage/__init__.py"
    ).read_text()
    assert not (overlay / "ngo/__init__.py").exists()  # the namespace stays a namespace
    assert _imported(tree, overlay, want) == "2 None"
    assert (tree / "packages/p/src/ngo/stage/named.py").read_text() == "value = 1\n"  # untouched


def test_without_its_package_the_overlay_is_not_imported(tree: Path) -> None:
    overlay = tree / "overlay"
    want = write_overlay(_mutant(), "value = 2\n", overlay)  # the file alone
    assert _imported(tree, overlay, want).startswith("1 overlay not imported")


def _found(name: str, path: list[str]) -> str | None:
    """The file module ``name`` is imported from on ``path``, found as PEP 420 orders it
    (a regular package or a module in the first entry that has one; namespace portions
    only where no entry has either), executing nothing."""
    search, origin = path, None
    for part in name.split("."):
        portions = []
        for entry in search:
            base = os.path.join(entry, part)
            if os.path.isfile(os.path.join(base, "__init__.py")):
                origin, search = os.path.join(base, "__init__.py"), [base]
                break
            if os.path.isfile(base + ".py"):
                origin, search = base + ".py", []
                break
            if os.path.isdir(base):
                portions.append(base)
        else:
            if not portions:
                return None
            origin, search = None, portions
    return origin


def test_every_mutant_of_the_real_stages_is_found_in_its_overlay(tmp_path: Path) -> None:
    """Each catalogued file's overlay shadows the tree's module, as the run's import would."""
    sources = [str(p) for p in sorted(ROOT.glob("packages/*/src"))]
    files = {m["file"] for spec in ROOT.glob("specs/*.toml") for m in _mutants(spec)}
    assert len(files) >= 16  # every named module of the stages carries mutants
    for n, file in enumerate(sorted(files)):
        mutant = Mutant("s", "m", "", file, "x", "y", None, "s", None)
        overlay = tmp_path / str(n)
        want = write_overlay(mutant, (ROOT / file).read_text(), overlay, ROOT)
        assert _found(mutant.module, [str(overlay), *sources]) == str(want), file


def _mutants(spec: Path) -> list[dict[str, str]]:
    found: list[dict[str, str]] = tomllib.loads(spec.read_text()).get("mutants", [])
    return found
