"""Invariant coverage: every spec invariant is claimed by a test, and every
claim names a spec invariant.

Claims are read statically from the stage test files
(``packages/*/tests/**/*.py``) and the acceptance tests beside the specs
(``specs/<stage>/tests/**/*.py``): any call ``<...>.mark.invariant("<stage>.<id>")``
counts, as a decorator, in ``pytestmark`` or in ``pytest.param(marks=...)``.
A claim that is not exactly one string literal is malformed.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from niels_gpt_contracts.gitdiff import Tree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import Spec, compile_patterns

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
INVARIANT_UNCLAIMED = Rule(
    "invariant.unclaimed",
    "A spec invariant is claimed by no test.",
    "Every invariant a stage declares must be claimed by at least one test with "
    "@pytest.mark.invariant('<stage>.<id>'), so that some test proves it on every "
    "device.",
    "Add or mark a test that proves the invariant.",
)

INVARIANT_UNKNOWN = Rule(
    "invariant.unknown",
    "A test claims an invariant no spec declares.",
    "A marker naming an invariant that no spec declares proves nothing the gate can "
    "count (often a typo).",
    "Correct the invariant id in the marker, or declare the invariant in the spec.",
)

INVARIANT_MALFORMED = Rule(
    "invariant.malformed",
    "An invariant marker is not a single string literal '<stage>.<id>'.",
    "Claims are read statically, so the marker's argument must be one string literal "
    "of the form '<stage>.<id>'.",
    "Write the marker as @pytest.mark.invariant('<stage>.<id>').",
)

STAGE_UNSPECIFIED = Rule(
    "stage.unspecified",
    "A stage package has no spec.",
    "Every package under packages/ must be owned by a stage spec in specs/, or "
    "nothing would judge the PRs that change it.",
    "Add a specs/<stage>.toml whose package is this directory (a maintainer change).",
)

# Stage tests, and the maintainer-owned acceptance tests beside the specs.
TEST_FILES = compile_patterns(["/packages/*/tests/**/*.py", "/specs/*/tests/**/*.py"])
_ID = re.compile(r"^[a-z][a-z0-9_]*\.[A-Za-z][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class Claim:
    path: str
    line: int
    id: str | None  # None: malformed marker
    problem: str = ""


def _is_marker(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "invariant"
        and (
            (isinstance(node.value, ast.Attribute) and node.value.attr == "mark")
            or (isinstance(node.value, ast.Name) and node.value.id == "mark")
        )
    )


def scan_claims(tree: Tree, only: Iterable[str] | None = None) -> list[Claim]:
    """Every invariant marker in the test files of ``tree`` (or in ``only`` of them)."""
    wanted = set(only) if only is not None else None
    paths = [
        f for f in tree.files() if TEST_FILES.match_file(f) and (wanted is None or f in wanted)
    ]
    claims: list[Claim] = []
    for path, text in sorted(tree.read_many(paths).items()):
        if text is None:
            continue
        try:
            mod = ast.parse(text)
        except SyntaxError as err:
            claims.append(
                Claim(
                    path,
                    err.lineno or 1,
                    None,
                    f"cannot parse ({err.msg}), so its invariant claims cannot be read",
                )
            )
            continue
        calls = {id(n.func) for n in ast.walk(mod) if isinstance(n, ast.Call)}
        for node in ast.walk(mod):
            if isinstance(node, ast.Call) and _is_marker(node.func):
                arg = node.args[0] if len(node.args) == 1 and not node.keywords else None
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    if _ID.match(arg.value):
                        claims.append(Claim(path, node.lineno, arg.value))
                    else:
                        claims.append(
                            Claim(
                                path,
                                node.lineno,
                                None,
                                f"expected an id '<stage>.<id>', found {arg.value!r}",
                            )
                        )
                else:
                    claims.append(
                        Claim(
                            path,
                            node.lineno,
                            None,
                            "expected one string "
                            f"literal '<stage>.<id>', found {ast.unparse(node)!r}",
                        )
                    )
            elif isinstance(node, ast.Attribute) and _is_marker(node) and id(node) not in calls:
                claims.append(
                    Claim(
                        path,
                        node.lineno,
                        None,
                        "expected mark.invariant('<stage>.<id>'), found the marker without an id",
                    )
                )
    return claims


def _owner(path: str, specs: Mapping[str, Spec]) -> str | None:
    return next(
        (
            s.id
            for s in specs.values()
            if path.startswith((s.package + "/", s.acceptance_dir + "/"))
        ),
        None,
    )


def check_invariants(
    spec: Spec, specs: Mapping[str, Spec], claims: list[Claim]
) -> tuple[list[Violation], int]:
    """Coverage of ``spec``'s invariants; bad claims in its files or naming it."""
    known = {i for s in specs.values() for i in s.invariant_ids()}
    out: list[Violation] = []
    claimed: set[str] = set()
    for claim in claims:
        named = claim.id.split(".", 1)[0] if claim.id else None
        owner = _owner(claim.path, specs)
        if claim.id in known:
            if named == spec.id:
                claimed.add(claim.id)
            continue
        mine = owner == spec.id or (named == spec.id) or (owner is None and named is None)
        if not mine:
            continue
        if claim.id is None:
            out.append(
                Violation(
                    INVARIANT_MALFORMED.id,
                    claim.path,
                    claim.line,
                    claim.problem,
                    spec.id,
                    "invariants",
                )
            )
        else:
            ids = sorted(i.split(".", 1)[1] for i in spec.invariant_ids())
            hint = f" (stage {named!r} declares: {', '.join(ids)})" if named == spec.id else ""
            out.append(
                Violation(
                    INVARIANT_UNKNOWN.id,
                    claim.path,
                    claim.line,
                    f"claims {claim.id!r}, which no spec declares{hint}",
                    spec.id,
                    "invariants",
                )
            )
    for inv in spec.invariants:
        full = f"{spec.id}.{inv.id}"
        if full not in claimed:
            out.append(
                Violation(
                    INVARIANT_UNCLAIMED.id,
                    spec.path,
                    inv.line,
                    f"invariant {full!r} is claimed by no test "
                    f"(@pytest.mark.invariant({full!r})): {inv.text}",
                    spec.id,
                    "invariants",
                )
            )
    return out, len(claimed)


def check_unowned(
    specs: Mapping[str, Spec], claims: list[Claim], files: list[str]
) -> list[Violation]:
    """Tree-wide: stage packages without a spec, and claims no stage can own.

    A claim in a package no spec owns, naming a stage that has no spec, would
    otherwise be judged by nobody; so would a package that has no spec at all.
    """
    known = {i for s in specs.values() for i in s.invariant_ids()}
    owned = {s.package for s in specs.values()}
    packages = sorted(
        {
            "/".join(f.split("/")[:2])
            for f in files
            if f.startswith("packages/") and f.count("/") == 2 and f.endswith("/pyproject.toml")
        }
    )
    out = [
        Violation(
            STAGE_UNSPECIFIED.id,
            f"{pkg}/pyproject.toml",
            None,
            f"package {pkg} has no stage spec (expected a specs/<stage>.toml whose package is it)",
            "repo",
            "stages",
        )
        for pkg in packages
        if pkg not in owned
    ]
    for claim in claims:
        named = claim.id.split(".", 1)[0] if claim.id else None
        if claim.id in known or _owner(claim.path, specs) is not None or named in specs:
            continue
        what = claim.problem or f"claims {claim.id!r}, which no spec declares"
        rule = INVARIANT_MALFORMED.id if claim.id is None else INVARIANT_UNKNOWN.id
        out.append(Violation(rule, claim.path, claim.line, what, "repo", "stages"))
    return out
