"""A stage's changelog: ``specs/<stage>/CHANGELOG.md``, the history its TOML no longer holds.

A spec states the contract as it is now; what each version changed and why
is written in the stage's changelog, newest first, one ``## <version> ...``
heading a version. The changelog is the maintainers' prose, not evidence:
an amendment may add to it (under the stage's ``Spec:`` trailer, like the
spec itself) and it moves no level (``verdict.amendment``). Its newest
heading names the spec's version, so an amendment that bumps the version
writes the entry that says why (``newest_version``).
"""

from __future__ import annotations

import re

from niels_gpt_contracts.stagespec import SPECS_DIR

FILENAME = "CHANGELOG.md"
_HEADING = re.compile(r"^## +(\d+\.\d+\.\d+)\b", re.MULTILINE)


def changelog_path(stage: str) -> str:
    """The repository path of ``stage``'s changelog."""
    return f"{SPECS_DIR}/{stage}/{FILENAME}"


def is_changelog(path: str) -> bool:
    """Whether a repository path is a stage's changelog (``specs/<stage>/CHANGELOG.md``)."""
    parts = path.split("/")
    return len(parts) == 3 and parts[0] == SPECS_DIR and parts[2] == FILENAME and parts[1] != "_kit"


def newest_version(text: str) -> str | None:
    """The version of the first ``## MAJOR.MINOR.PATCH`` heading; ``None`` when there is none."""
    found = _HEADING.search(text)
    return found.group(1) if found else None
