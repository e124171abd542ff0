"""The sandbox's scratch variables and its confinement, checked by writing (issue 50).

Every process a verdict starts gets ``HOME``, ``TMPDIR`` and the caches of
its tools inside the sandbox's scratch folder; where Linux allows, the
directory the verdict was started from, the user's home, ``/tmp`` outside
the scratch folder and the listed paths are read-only to it, and
``confined`` proves that by writing from inside, failing closed when a write
goes through.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.sandbox import confine
from niels_gpt_contracts.sandbox.environment import CACHES, Sandbox

WRITE = """
import os, sys
for place in sys.argv[1:]:
    try:
        with open(os.path.join(place, "written"), "w") as out:
            out.write("x")
        print("wrote", place)
    except OSError as err:
        print("refused", place, err.errno)
"""


@pytest.fixture
def box(tmp_path: Path) -> Sandbox:
    return Sandbox.prepare(sys.executable, tmp_path / "scratch" / "sandbox", ["niels_gpt"], 1)


def test_every_run_writes_its_home_temporary_folder_and_caches_in_scratch(box: Sandbox) -> None:
    env = box.environ([])
    for var in ("HOME", "TMPDIR", *CACHES):
        assert Path(env[var]).is_relative_to(box.root), var
        assert Path(env[var]).is_dir(), var
    assert env["PYTHONDONTWRITEBYTECODE"] == "1"


def _confined(box: Sandbox, readonly: list[Path]) -> Sandbox:
    inner, how = confine.confined(box, readonly)
    if how.startswith("not confined"):
        pytest.skip(f"this machine cannot confine: {how}")
    return inner


def test_a_confined_run_writes_its_scratch_and_nowhere_else(
    box: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fresh, home, repo = tmp_path / "fresh", tmp_path / "home", tmp_path / "repo"
    for folder in (fresh, home, repo):
        folder.mkdir()
    monkeypatch.chdir(fresh)
    monkeypatch.setenv("HOME", str(home))
    inner = _confined(box, [repo])
    cache = Path(box.environ([])["XDG_CACHE_HOME"])
    places = [fresh, home, repo, tmp_path, box.boot, box.tmp, cache]
    done = subprocess.run(
        [inner.python, "-I", "-c", WRITE, *map(str, places)],
        cwd=box.home,
        capture_output=True,
        text=True,
        check=True,
    )
    wrote = {line.split()[1] for line in done.stdout.splitlines() if line.startswith("wrote")}
    assert wrote == {str(box.tmp), str(cache)}, done.stdout


def test_a_namespace_that_lets_a_write_through_fails_closed(
    box: Sandbox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wrapper that starts but mounts nothing: ``confined`` must not claim it."""
    _confined(box, [])  # only where the real one works; its wrapper is replaced below
    monkeypatch.chdir(tmp_path)
    leaky = '#!/bin/sh\nexec {python} "$@"\n# {userns}{failed}{listing}\n'
    monkeypatch.setattr(confine, "SCRIPT", leaky)
    with pytest.raises(ConfigError, match="a write from inside succeeded in"):
        confine.confined(box, [])
