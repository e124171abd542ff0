"""The spec model on its own: the repository's specs, the line finder."""

from __future__ import annotations

from pathlib import Path

import tomllib
from packaging.requirements import Requirement

from niels_gpt_contracts.stagespec import load_schema, parse_specs
from niels_gpt_contracts.tomllines import key_lines

ROOT = Path(__file__).resolve().parents[2]


def test_repository_specs_are_valid() -> None:
    schema = load_schema((ROOT / "specs" / "spec.schema.json").read_text())
    texts = {f"specs/{p.name}": p.read_text() for p in (ROOT / "specs").glob("*.toml")}
    specs = parse_specs(texts, schema)
    # a spec per stage package (a spec may come first: its package is pending)
    assert set(specs) >= {p.name for p in (ROOT / "packages").iterdir() if p.is_dir()}
    assert {"core", "rope", "attention", "block", "backbone_v1"} <= set(specs)
    assert specs["backbone_v1"].line_scoped[0].keyword == "V"


def test_key_lines() -> None:
    text = (
        'a = 1\n[t]\nb = "x"\nc.d = [\n  "p",\n  "q",\n]\n'
        '[[arr]]\nid = \'one\'\n[arr.sub]\nk = 2\n[[arr]]\nid = """two\n"""\n'
        "e = {f = 1, g = [1, 2]}\n"
    )
    lines = key_lines(text)
    assert lines[("a",)] == 1
    assert lines[("t", "c", "d", 1)] == 6
    assert lines[("arr", 0, "sub", "k")] == 11
    assert lines[("arr", 1, "id")] == 13
    assert lines[("arr", 1, "e", "g", 1)] == 15


def test_the_declared_torch_floor_is_the_tested_version() -> None:
    """Every stage declares torch>=X where X is the version constraints.txt pins and CI tests."""
    pins = dict(
        line.split("==", 1)
        for line in (ROOT / "constraints.txt").read_text().splitlines()
        if "==" in line and not line.startswith("#")
    )
    tested = pins["torch"].strip()
    floors = {}
    for pyproject in sorted((ROOT / "packages").glob("*/pyproject.toml")):
        deps = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
        (torch_req,) = [Requirement(d) for d in deps if Requirement(d).name == "torch"]
        floors[pyproject.parent.name] = str(torch_req.specifier)
    assert floors and set(floors.values()) == {f">={tested.rsplit('.', 1)[0]}"}, floors
