"""What the docs say about versions agrees with what the packaging files declare."""

from __future__ import annotations

import re
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
STAGE_PYPROJECTS = sorted(ROOT.glob("packages/*/pyproject.toml"))


def _project(path: Path) -> dict[str, object]:
    project = tomllib.loads(path.read_text())["project"]
    assert isinstance(project, dict)
    return project


def test_constraints_pin_each_distribution_once() -> None:
    names: dict[str, int] = {}
    for number, line in enumerate((ROOT / "constraints.txt").read_text().splitlines(), 1):
        text = line.split("#", 1)[0].strip()
        if not text:
            continue
        req = Requirement(text)
        assert len(req.specifier) == 1 and next(iter(req.specifier)).operator == "==", line
        name = canonicalize_name(req.name)
        assert name not in names, f"{name} pinned on lines {names[name]} and {number}"
        names[name] = number


def test_the_constraints_header_states_the_packages_torch_bound() -> None:
    header = (ROOT / "constraints.txt").read_text().split("\n\n", 1)[0]
    said = re.search(r"\(torch([<>=!~][^)]*)\)", header)
    assert said, header
    declared = set()
    for path in STAGE_PYPROJECTS:
        deps = _project(path)["dependencies"]
        assert isinstance(deps, list)
        declared |= {str(Requirement(d).specifier) for d in deps if d.startswith("torch")}
    assert declared == {said.group(1)}, (declared, said.group(1))


def test_the_readme_asks_for_the_python_the_tools_need() -> None:
    said = re.search(r"Python >= (3\.\d+)", (ROOT / "README.md").read_text())
    assert said, "README.md states no Python version"
    floors = []
    for path in (ROOT / "contracts" / "pyproject.toml", ROOT / "pyproject.toml"):
        (spec,) = SpecifierSet(str(_project(path)["requires-python"]))
        assert spec.operator == ">=", (path, spec)
        floors.append(Version(spec.version))
    assert max(floors) == Version(said.group(1)), (floors, said.group(0))
