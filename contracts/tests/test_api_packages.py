"""A stage module that is a package: its public definitions are found in its named modules.

A stage's ``__init__.py`` re-exports what its named modules define (issue 31).
The API probe's exports check must then count those definitions as the
package's, and also the public definitions of a public named module that the
package does not re-export: they are reachable at that module's own import path.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from niels_gpt_contracts.checks.public_api import api

PROBE = Path(api.__file__).with_name("_api_probe.py")

INIT = '''"""A stage package."""
from pkgs_stage.named import Thing, run
from pkgs_stage._private import Hidden
from pkgs_other import Foreign

__all__ = ["Foreign", "Hidden", "Thing", "run"]
'''
NAMED = """from pkgs_stage._private import Hidden


class Thing:
    pass


def run():
    return Hidden


def _helper():
    return 1
"""
PRIVATE = """class Hidden:
    pass


def shared_check():
    return 0
"""


@pytest.fixture
def probe() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_api_probe_under_test", PROBE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def tree(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / "pkgs_stage").mkdir()
    (tmp_path / "pkgs_stage" / "__init__.py").write_text(INIT)
    (tmp_path / "pkgs_stage" / "named.py").write_text(NAMED)
    (tmp_path / "pkgs_stage" / "_private.py").write_text(PRIVATE)
    (tmp_path / "pkgs_other.py").write_text("class Foreign:\n    pass\n")
    sys.path.insert(0, str(tmp_path))
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in [n for n in sys.modules if n.startswith(("pkgs_stage", "pkgs_other"))]:
        del sys.modules[name]


def _public(probe: ModuleType, name: str) -> set[str]:
    importlib.invalidate_caches()
    found: set[str] = probe.public_definitions(importlib.import_module(name))
    return found


def test_a_package_owns_what_it_binds_from_its_own_modules(probe: ModuleType, tree: Path) -> None:
    # Foreign is another module's class: a re-export, not a definition of the stage.
    assert _public(probe, "pkgs_stage") == {"Hidden", "Thing", "run"}


def test_a_public_definition_left_in_a_named_module_is_found(probe: ModuleType, tree: Path) -> None:
    (tree / "pkgs_stage" / "named.py").write_text(NAMED + "\n\ndef helper():\n    return 2\n")
    assert _public(probe, "pkgs_stage") == {"Hidden", "Thing", "run", "named.helper"}


def test_a_name_bound_to_another_object_than_the_module_defines_is_found(
    probe: ModuleType, tree: Path
) -> None:
    (tree / "pkgs_stage" / "__init__.py").write_text(
        INIT.replace(
            "from pkgs_stage.named import Thing, run", "from pkgs_stage.named import Thing"
        )
        + "\n\ndef run():\n    return None\n"
    )
    assert _public(probe, "pkgs_stage") == {"Hidden", "Thing", "run", "named.run"}


def test_a_named_module_that_does_not_import_is_reported(probe: ModuleType, tree: Path) -> None:
    (tree / "pkgs_stage" / "broken.py").write_text("1 / 0\n")
    assert "broken (import failed: ZeroDivisionError)" in _public(probe, "pkgs_stage")


def test_a_rebound_path_does_not_hide_a_named_module(probe: ModuleType, tree: Path) -> None:
    (tree / "pkgs_stage" / "named.py").write_text(NAMED + "\n\ndef helper():\n    return 2\n")
    (tree / "pkgs_stage" / "__init__.py").write_text(INIT + "\n__path__ = []\n")
    assert "named.helper" in _public(probe, "pkgs_stage")


def test_a_plain_module_counts_only_its_own_definitions(probe: ModuleType, tree: Path) -> None:
    (tree / "pkgs_plain.py").write_text(
        "from pkgs_other import Foreign\n\n\ndef mine():\n    return Foreign\n"
    )
    try:
        assert _public(probe, "pkgs_plain") == {"mine"}
    finally:
        sys.modules.pop("pkgs_plain", None)
