"""``dependencies``: ``[project].dependencies`` of ``pyproject`` names exactly the
distributions in ``allowed`` (names compared canonicalised, by ``packaging``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from niels_gpt_contracts.rules.spec_rules import Finding, RuleKind, Source


def _line_of(text: str, needle: str) -> int | None:
    for number, line in enumerate(text.splitlines(), start=1):
        if needle in line:
            return number
    return None


def check(params: Mapping[str, Any], tree: Source, files: list[str]) -> list[Finding]:
    path: str = params["pyproject"]
    allowed = {canonicalize_name(n) for n in params["allowed"]}
    text = tree.read(path)
    if text is None:
        return [(path, None, "expected a pyproject.toml here, found none")]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        return [(path, None, f"expected valid TOML, found: {err}")]
    deps = data.get("project", {}).get("dependencies", [])
    if not isinstance(deps, list):
        return [
            (
                path,
                _line_of(text, "dependencies"),
                f"expected [project].dependencies to be a list, found {type(deps).__name__}",
            )
        ]
    found: list[Finding] = []
    declared: set[str] = set()
    for dep in deps:
        try:
            name = canonicalize_name(Requirement(str(dep)).name)
        except InvalidRequirement as err:
            found.append((path, _line_of(text, str(dep)), f"invalid requirement {dep!r}: {err}"))
            continue
        declared.add(name)
        if name not in allowed:
            found.append(
                (
                    path,
                    _line_of(text, str(dep)),
                    f"new runtime dependency {dep!r}; allowed: {sorted(allowed)}",
                )
            )
    for name in sorted(allowed - declared):
        found.append(
            (
                path,
                _line_of(text, "dependencies"),
                f"expected dependency {name!r} declared, found it missing",
            )
        )
    return found


KIND = RuleKind(
    "dependencies",
    "the package's [project].dependencies name exactly the allowed distributions",
    {
        "pyproject": {"type": "string"},
        "allowed": {
            "type": "array",
            "items": {"type": "string"},
            "uniqueItems": True,
            "description": "The exact set of distribution names `[project].dependencies` may name.",
        },
    },
    ("pyproject", "allowed"),
    check,
)
