"""``contracts pr`` on a PR that writes where the maintainers' tooling lives (issue 50).

The attention stage's code (at import) and its tests (one of them a
Hypothesis test) try to write into the directory the verdict was started
from, into ``$HOME``, into ``/tmp`` outside the verdict's scratch and into
the repository: by their literal paths (an attacker who knows them), through
the process's own ``HOME``, working directory and temporary folder, and
through the caches Hypothesis and torch pick for themselves. The verdict runs
every phase, the mutants' fork servers included; afterwards none of those
places may hold anything new.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import pytest
from realkit import RealRepo

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

ATTN = "packages/attention/src/niels_gpt/model/attention/causal.py"
TEST = "packages/attention/tests/test_attention.py"
# Written into the stage's module and its tests, with the places filled in.
ESCAPE = '''
def _escape(where):
    """Try every write a PR's code could make outside its scratch; ignore refusals."""
    import os as _os
    import tempfile as _tempfile

    name = "escape-{token}-" + where
    places = [{places}, _os.path.expanduser("~"), _os.getcwd(), _tempfile.gettempdir()]
    try:
        from hypothesis.configuration import storage_directory

        places.append(str(storage_directory("escape-{token}")))
    except Exception:
        pass
    try:
        import torch.hub

        places.append(torch.hub.get_dir())
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        places.append(cache_dir())
    except Exception:
        pass
    for place in places:
        try:
            _os.makedirs(place, exist_ok=True)
            with open(_os.path.join(place, name), "w") as out:
                out.write("written by the PR")
        except Exception:
            pass
'''
HYPOTHESIS_TEST = """

from hypothesis import given, strategies as st


@given(st.integers(0, 3))
def test_escape_through_hypothesis(n):
    _escape("given")
    assert n >= 0
"""


def _files(root: Path, skip: Path | None = None) -> dict[str, tuple[int, int]]:
    """``path -> (size, mtime_ns)`` of every file and link under ``root``."""
    found: dict[str, tuple[int, int]] = {}
    for folder, dirs, names in os.walk(root):
        if skip is not None:
            dirs[:] = [d for d in dirs if Path(folder, d) != skip]
        for name in [*names, *dirs]:
            path = Path(folder, name)
            st = path.lstat()
            found[str(path)] = (st.st_size, st.st_mtime_ns if name in names else 0)
    return found


def _snapshot(fresh: Path, home: Path, repo: Path) -> dict[str, tuple[int, int]]:
    """The invoking directory, ``$HOME`` and the checkout (its git folder aside)."""
    return {**_files(fresh), **_files(home), **_files(repo, skip=repo / ".git")}


def _tmp_marked(token: str, basetemp: Path) -> list[str]:
    """Paths under ``/tmp`` (three levels down, pytest's folders left out) naming ``token``."""
    found: list[str] = []
    for folder, dirs, names in os.walk("/tmp"):
        depth = Path(folder).relative_to("/tmp").parts
        dirs[:] = [] if len(depth) >= 2 else [d for d in dirs if Path(folder, d) != basetemp]
        found += [str(Path(folder, n)) for n in [*names, *dirs] if token in n]
    return sorted(found)


def test_a_pr_that_writes_outside_its_scratch_leaves_every_place_as_it_was(
    real_repo: RealRepo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    token = uuid.uuid4().hex[:12]
    fresh, home = tmp_path / "fresh", tmp_path / "home"
    fresh.mkdir()
    home.mkdir()
    (home / ".profile").write_text("# the maintainer's\n", encoding="utf-8")
    places = ", ".join(repr(str(p)) for p in (fresh, home, real_repo.root, Path("/tmp")))
    escape = ESCAPE.format(token=token, places=places)
    module = real_repo.read(ATTN)
    real_repo.write(ATTN, module + escape + '\n\n_escape("stage")\n')
    real_repo.write(TEST, real_repo.read(TEST) + escape + HYPOTHESIS_TEST)
    real_repo.pr("attention")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(fresh)
    basetemp = tmp_path.parents[1]  # pytest-of-<user>: this run's own folders
    before = _snapshot(fresh, home, real_repo.root)
    assert _tmp_marked(token, basetemp) == []

    real_repo.verdict()  # every phase (--full), the mutants' fork servers included

    after = _snapshot(fresh, home, real_repo.root)
    assert sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k)) == []
    assert _tmp_marked(token, basetemp) == []
