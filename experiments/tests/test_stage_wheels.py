"""The stage wheels as installed: each file belongs to one of them (PEP 561 per stage).

Run from the wheels (``nox -s test-experiments``). Every stage module is a
package of its own with its own ``py.typed``, so no file is shipped by two
wheels and uninstalling one stage cannot take another stage's marker with it.
"""

from __future__ import annotations

from importlib import metadata

import pytest

NOT_STAGES = ("niels-gpt-experiments", "niels-gpt-contracts")


def _stage_files() -> dict[str, list[str]]:
    """File path (``niels_gpt/...``) -> the installed stage distributions that ship it."""
    shipped: dict[str, list[str]] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if not name.startswith("niels-gpt-") or name in NOT_STAGES:
            continue
        for file in dist.files or []:
            if str(file).startswith("niels_gpt/"):
                shipped.setdefault(str(file), []).append(name)
    return shipped


def test_no_file_is_in_two_stage_wheels() -> None:
    shipped = _stage_files()
    if not shipped:
        pytest.fail(
            "no stage wheel is installed here: run from the wheels (nox -s test-experiments)"
        )
    twice = {path: names for path, names in shipped.items() if len(names) > 1}
    assert twice == {}


def test_every_stage_package_carries_its_own_marker() -> None:
    shipped = _stage_files()
    packages = {path.rsplit("/", 1)[0] for path in shipped if path.endswith("/__init__.py")}
    assert packages, "no stage package found"
    missing = sorted(p for p in packages if f"{p}/py.typed" not in shipped)
    assert missing == []
    assert "niels_gpt/model/py.typed" not in shipped and "niels_gpt/py.typed" not in shipped
