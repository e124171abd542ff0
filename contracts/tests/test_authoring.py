"""The maintainers' authoring tools: ``contracts spec api`` and ``contracts new-stage``.

``spec api --freeze`` reads the stages' source with griffe and must give back
every real spec's ``[[api]]`` as the API check reads it; ``--check`` exits 1
when spec and code part. ``new-stage`` scaffolds a stage in a copy of this
repository that ``contracts check --stage`` then keeps.
"""

from __future__ import annotations

import contextlib
import io
import shutil
import subprocess
from pathlib import Path

import pytest
import tomllib
from gatekit import Repo

from niels_gpt_contracts.authoring import freeze
from niels_gpt_contracts.checks.context.loading import load_specs
from niels_gpt_contracts.cli import main
from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree
from niels_gpt_contracts.stagespec import ApiEntry, Spec

ROOT = Path(__file__).resolve().parents[2]
STAGES = sorted(p.stem for p in (ROOT / "specs").glob("*.toml"))
SIG = "(x: list[float], *, turns: int = 1, label: str | None = None) -> list[float]"


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def real() -> tuple[dict[str, Spec], dict[str, list[ApiEntry]]]:
    """Every real spec, and its ``[[api]]`` frozen from the stages' source."""
    specs = load_specs(WorkingTree(GitRepo.discover(ROOT)))
    needed = {m for s in specs.values() for m in freeze.needed_modules(s)}
    source = freeze.load(ROOT, specs, needed)
    return specs, {stage: freeze.freeze(source, spec) for stage, spec in specs.items()}


@pytest.mark.parametrize("stage", STAGES)
def test_freeze_gives_back_the_spec_api(
    stage: str, real: tuple[dict[str, Spec], dict[str, list[ApiEntry]]]
) -> None:
    specs, frozen = real
    assert freeze.differences(specs[stage].api, frozen[stage]) == []
    parsed = tomllib.loads(freeze.to_toml(frozen[stage]))["api"]
    written = tomllib.loads((ROOT / "specs" / f"{stage}.toml").read_text(encoding="utf-8"))["api"]
    assert [e["object"] for e in parsed] == [e["object"] for e in written]
    assert [sorted(e) for e in parsed] == [sorted(e) for e in written]  # the same keys


def test_freeze_prints_rope_api_as_written() -> None:
    code, out, _ = _cli("spec", "api", "--freeze", "rope", "--repo", str(ROOT))
    assert code == 0
    spec = (ROOT / "specs" / "rope.toml").read_text(encoding="utf-8")
    for block in out.strip().split("\n\n"):
        assert block in spec  # byte for byte: rope's API is spelled as render spells it


def test_check_keeps_and_breaks(repo: Repo) -> None:
    code, out, _ = _cli("spec", "api", "--check", "alpha", "--repo", str(repo.root))
    assert (code, out) == (0, "KEPT: specs/alpha.toml's 3 [[api]] entries are its code's\n")
    repo.replace("specs/alpha.toml", "turns: int = 1", "turns: int = 2")
    code, out, _ = _cli("spec", "api", "--check", "alpha", "--repo", str(repo.root))
    assert code == 1
    assert "ngx.alpha_mod:rotate: parameter 'turns': expected default 2, found 1" in out
    assert out.endswith("`contracts spec api --freeze alpha` prints the code's\n")
    code, out, _ = _cli("spec", "api", "--freeze", "alpha", "--repo", str(repo.root))
    assert code == 0 and f'signature = "{SIG}"' in out


def test_freeze_all_pins_every_export(repo: Repo) -> None:
    code, out, _ = _cli("spec", "api", "--freeze", "alpha", "--all", "--repo", str(repo.root))
    assert code == 0, out
    pinned = tomllib.loads(out)["api"]
    assert [e["object"] for e in pinned] == [
        "ngx.alpha_mod",
        "ngx.alpha_mod:Thing",
        "ngx.alpha_mod:rotate",
    ]
    assert pinned[1]["methods"] == {
        "__init__": "(self, size: int) -> None",
        "run": "(self, x: float, *, fast: bool = False) -> float",
    }


def test_unknown_stage_is_an_error(repo: Repo) -> None:
    code, _, err = _cli("spec", "api", "--check", "gamma", "--repo", str(repo.root))
    assert code == 2
    assert "expected a stage among ['alpha', 'beta'], found 'gamma'" in err


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """This repository's tracked files, as the working tree has them, in a new repository."""
    dest = tmp_path_factory.mktemp("clone")
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z"], capture_output=True, check=True, text=True
    ).stdout
    for rel in filter(None, listed.split("\0")):
        src = ROOT / rel
        if src.is_file() and not src.is_symlink():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    subprocess.run(["git", "-C", str(dest), "init", "-q"], check=True)
    return dest


def test_new_stage_is_kept(clone: Path) -> None:
    code, out, err = _cli("new-stage", "demo", "--after", "rope", "--repo", str(clone))
    assert code == 0, err
    for path in (
        "specs/demo.toml",
        "specs/demo/CHANGELOG.md",
        "specs/demo/demo_reference.py",
        "specs/demo/demo_oracle.py",
        "specs/demo/tests/test_demo_acceptance.py",
        "packages/demo/pyproject.toml",
        "packages/demo/src/niels_gpt/model/demo/__init__.py",
        "packages/demo/src/niels_gpt/model/demo/py.typed",
        "packages/demo/tests/test_demo.py",
    ):
        assert f"wrote {path}\n" in out
        assert (clone / path).is_file()
    spec = tomllib.loads((clone / "specs/demo.toml").read_text(encoding="utf-8"))
    assert spec["depends_on"] == ["rope"]
    assert spec["api"] == [{"object": "niels_gpt.model.demo", "kind": "module", "exports": []}]
    code, out, _ = _cli("check", "--stage", "demo", "--repo", str(clone))
    assert code == 0, out
    assert "KEPT: 1 stage, 1 KEPT, 0 BROKEN; 0 violations" in out
    code, out, _ = _cli("spec", "api", "--check", "demo", "--repo", str(clone))
    assert code == 0, out


@pytest.mark.parametrize(
    ("name", "after", "expected"),
    [
        ("Demo", "rope", "expected a lower-case identifier ([a-z][a-z0-9_]*), found 'Demo'"),
        ("rope", "core", "expected a new stage name, found 'rope' taken"),
        ("other", "nothing", "expected --after among ["),
    ],
)
def test_new_stage_refuses(clone: Path, name: str, after: str, expected: str) -> None:
    code, _, err = _cli("new-stage", name, "--after", after, "--repo", str(clone))
    assert code == 2
    assert expected in err
