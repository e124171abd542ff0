"""The verbatim split judged on the real stages, where a maintainer's amendment could hide code.

An amendment may move a package's code out of its ``__init__.py`` into a
module beside it when the module is the base's ``__init__.py`` to the letter
and the ``__init__.py`` left behind only re-exports (``checks/spec_changes/reexports.py``;
the shapes are ``test_amendment.py``'s toy cases). Here the whole
``contracts check --base main --head HEAD`` judges maintainers' commits on
the scenario repository of the real stages: rope's ``__init__.py`` is split
into ``rope/helpers.py`` with its spec amended to list it, honestly, then
with one line of code more in the moved text, then with a change to
``rope/rotary.py`` carried along under the split's cover. Only the honest
split is an amendment; each smuggle is ``amendment.path`` on the files that
carry it, so the range is BROKEN and no code lands without a stage PR.
About four seconds a case (no sandbox run), so test-contracts runs them.
"""

from __future__ import annotations

import json
from typing import Any

from realkit import RealRepo

PKG = "packages/rope/src/niels_gpt/model/rope"
SPEC = "specs/rope.toml"
LISTED = '    "niels_gpt/model/rope/rotary.py",\n'
REEXPORT = '''"""RoPE, re-exported from ``helpers``."""

from __future__ import annotations

from niels_gpt.model.rope.helpers import apply_rope, rope_cache

__all__ = ["apply_rope", "rope_cache"]
'''


def _split(
    repo: RealRepo, moved_extra: str = "", rotary_edit: tuple[str, str] | None = None
) -> None:
    """A maintainers' commit: rope's ``__init__.py`` moved into ``helpers.py`` (plus
    ``moved_extra``), a re-exporting ``__init__.py``, the spec listing the module."""
    init = repo.read(f"{PKG}/__init__.py")
    repo.write(f"{PKG}/helpers.py", init + moved_extra)
    repo.write(f"{PKG}/__init__.py", REEXPORT)
    if rotary_edit is not None:
        repo.replace(f"{PKG}/rotary.py", *rotary_edit)
    spec = repo.read(SPEC)
    assert spec.count(LISTED) == 1, "rope's module list moved; update this scenario"
    version = next(line for line in spec.splitlines() if line.startswith("version = "))
    major, minor, _ = version.removeprefix('version = "').removesuffix('"').split(".")
    spec = spec.replace(LISTED, LISTED + '    "niels_gpt/model/rope/helpers.py",\n', 1)
    repo.write(SPEC, spec.replace(version, f'version = "{major}.{int(minor) + 1}.0"', 1))
    repo.commit("rope: helpers.py holds what __init__.py re-exports\n\nSpec: rope")


def _judged(repo: RealRepo) -> tuple[int, dict[str, Any]]:
    code, out, err = repo.gate("--base", "main", "--head", "HEAD", "--format", "json")
    assert code != 2, err[-2000:]
    return code, json.loads(out)


def _path_violations(out: dict[str, Any]) -> list[dict[str, Any]]:
    return [v for v in out["violations"] if v["rule"] == "amendment.path"]


def test_a_verbatim_split_of_a_real_stage_is_an_amendment(real_repo: RealRepo) -> None:
    _split(real_repo)
    code, out = _judged(real_repo)
    assert code == 0, out["violations"]
    rows = {(o["stage"], o["check"]): o for o in out["outcomes"]}
    assert rows[("rope", "amendment")]["summary"].startswith("ADDITIVE"), rows


def test_one_line_more_in_the_moved_text_is_not_an_amendment(real_repo: RealRepo) -> None:
    _split(real_repo, moved_extra="\ntorch_threads = 1\n")
    code, out = _judged(real_repo)
    assert code == 1, out
    # not a split any more: the module and the __init__.py it left are changed code
    paths = {v["path"] for v in _path_violations(out)}
    assert paths == {f"{PKG}/helpers.py", f"{PKG}/__init__.py"}, out["violations"]


def test_a_change_under_a_splits_cover_is_not_an_amendment(real_repo: RealRepo) -> None:
    _split(real_repo, rotary_edit=("-2.0 * i / D)", "-2.01 * i / D)"))
    code, out = _judged(real_repo)
    assert code == 1, out
    found = _path_violations(out)
    assert [v["path"] for v in found] == [f"{PKG}/rotary.py"], out["violations"]
