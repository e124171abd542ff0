"""A stage's changelog: the spec's history beside it, named by the trailer, judged as prose.

The real specs carry their history in ``specs/<stage>/CHANGELOG.md``, whose
newest heading is the spec's version; an amendment that adds to a changelog
is KEPT (no version bump) under the stage's trailer and BROKEN without it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import tomllib
from amendkit import amend, judge, row
from gatekit import Repo, rules

from niels_gpt_contracts.checks.spec_changes.changelog import (
    changelog_path,
    is_changelog,
    newest_version,
)

ROOT = Path(__file__).resolve().parents[2]
STAGES = sorted(p.stem for p in (ROOT / "specs").glob("*.toml"))


def test_changelog_paths() -> None:
    assert changelog_path("rope") == "specs/rope/CHANGELOG.md"
    assert is_changelog("specs/rope/CHANGELOG.md")
    assert not is_changelog("specs/rope/tests/CHANGELOG.md")
    assert not is_changelog("specs/_kit/CHANGELOG.md")
    assert not is_changelog("specs/rope/rope_oracle.py")
    assert not is_changelog("packages/rope/CHANGELOG.md")


def test_newest_version_is_the_first_heading() -> None:
    text = "# Changelog\n\nprose 9.9.9\n\n## 2.1.0 (2026-11-29)\n\n- x\n\n## 2.0.0\n"
    assert newest_version(text) == "2.1.0"
    assert newest_version("# Changelog\n\n### 1.0.0\n") is None


@pytest.mark.parametrize("stage", STAGES)
def test_every_spec_has_a_changelog_at_its_version(stage: str) -> None:
    spec = tomllib.loads((ROOT / "specs" / f"{stage}.toml").read_text(encoding="utf-8"))
    log = ROOT / changelog_path(stage)
    assert log.is_file(), f"expected {log.relative_to(ROOT)} beside specs/{stage}.toml"
    found = newest_version(log.read_text(encoding="utf-8"))
    assert found == spec["version"], (
        f"expected the newest entry of {changelog_path(stage)} to be {spec['version']} "
        f"(the spec's version), found {found}"
    )


# A comment that tells history: a version note ("13.0: size, ...") or another
# stage's version ("attention 5.1"), which goes stale as that stage moves on.
_HISTORY = re.compile(rf"^\s*#(?:\s*\d+\.\d+(?:\.\d+)?:|.*\b(?:{'|'.join(STAGES)}) \d+\.\d+)")


@pytest.mark.parametrize("stage", STAGES)
def test_a_spec_states_the_present_and_leaves_its_history_to_the_changelog(stage: str) -> None:
    lines = (ROOT / "specs" / f"{stage}.toml").read_text(encoding="utf-8").splitlines()
    found = [f"{n}: {line.strip()}" for n, line in enumerate(lines, 1) if _HISTORY.match(line)]
    assert found == [], (
        f"expected no version history in specs/{stage}.toml's comments "
        f"(it belongs in {changelog_path(stage)}), found: {found}"
    )


def test_a_changelog_entry_is_kept(repo: Repo) -> None:
    repo.write("specs/alpha/CHANGELOG.md", "# alpha\n\n## 1.0.0\n\n- why alpha exists\n")
    amend(repo, "", "")
    code, out = judge(repo)
    assert code == 0, out
    assert row(out)["summary"] == "KEPT 1.0.0 -> 1.0.0"


def test_a_changelog_needs_its_stage_trailer(repo: Repo) -> None:
    repo.write("specs/beta/CHANGELOG.md", "# beta\n\n## 1.0.0\n")
    amend(repo, 'title = "Alpha stage"', 'title = "The alpha stage"')
    code, out = judge(repo)
    assert code == 1, out
    assert ("amendment.trailer", "specs/beta/CHANGELOG.md") in rules(out)
