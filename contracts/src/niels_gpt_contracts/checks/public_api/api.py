"""The public API check: import each listed object and compare it with the spec.

The import happens in a fresh interpreter (``_api_probe.py``) whose path starts
with the ``packages/*/src`` roots of the tree under check, so the working tree,
or a commit written out to a temporary directory, is what gets inspected.

Signatures are compared parameter by parameter: name, kind (positional-only,
positional-or-keyword, ``*args``, keyword-only, ``**kwargs``), default and
annotation, then the return annotation. Annotations and defaults are compared
as normalised expressions (``ast.parse`` then ``ast.unparse``), so
``"str|torch.device"`` and ``str | torch.device`` are equal and quoting or
spacing never matters. For ``__init__`` a missing return annotation equals
``None``.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tempfile
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import msgspec

from niels_gpt_contracts.checks.public_api.answer import Found, Method
from niels_gpt_contracts.checks.public_api.api_source import judge_source
from niels_gpt_contracts.checks.public_api.signatures import (
    compare_signatures,
    norm,
    parse_signature,
)
from niels_gpt_contracts.decoding import Malformed, decode, last_line, one_line
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import Tree, WorkingTree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import ApiEntry, Spec, compile_patterns

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
API_MISSING = Rule(
    "api.missing",
    "A public object the spec lists cannot be imported.",
    "Each object in the stage spec's API must import from its listed module path, in "
    "a fresh interpreter over the tree's packages.",
    "Restore the object at the import path the spec names (or fix the import error "
    "the message shows).",
)

API_KIND = Rule(
    "api.kind",
    "A public object is not of the kind the spec says.",
    "The spec lists each public object as a module, a function or a class; the "
    "object found must be of that kind.",
    "Make the object the kind the spec lists again.",
)

API_SIGNATURE = Rule(
    "api.signature",
    "A public signature differs from the spec.",
    "Signatures are compared parameter by parameter: name, kind, default and "
    "annotation, and the return annotation; annotations are normalised, so quoting "
    "and spacing do not matter.",
    "Change the signature back to the spec's (the message shows the first difference).",
)

API_EXPORTS = Rule(
    "api.exports",
    "A module does not export exactly the names the spec lists.",
    "A module's __all__ must name exactly the spec's exports, and each must exist.",
    "Set __all__ to the spec's list and define every name in it.",
)

API_FIELDS = Rule(
    "api.fields",
    "A class does not declare exactly the fields the spec lists.",
    "A dataclass-like class must declare exactly the annotated fields the spec "
    "lists, with the same annotations.",
    "Declare the spec's fields, no more and no fewer.",
)

API_IDENTITY = Rule(
    "api.identity",
    "A re-exported object is not the very object the spec names.",
    "Where the spec says an object is the same as another (a re-export), both paths "
    "must give the identical object, not a copy or a wrapper.",
    "Re-export the original object instead of redefining it.",
)

API_PROBE = Rule(
    "api.probe",
    "The public API could not be inspected.",
    "The API is inspected by importing the tree's packages in a fresh interpreter; an "
    "import that fails or a probe that crashes leaves the API unverified, which "
    "counts as broken.",
    "Fix the import or crash the message shows, so that the API can be inspected.",
)

PROBE = Path(__file__).with_name("_api_probe.py")
SRC_FILES = compile_patterns(["/packages/*/src/**/*.py"])
TIMEOUT_S = 300


def _request(entry: ApiEntry) -> dict[str, Any]:
    return {
        "object": entry.object,
        "signature": entry.signature is not None,
        "methods": list(entry.methods),
        "fields": entry.fields is not None,
        "exports": entry.exports is not None,
        "same_as": entry.same_as,
    }


def probe(
    tree: Tree,
    entries: list[ApiEntry],
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    only: Collection[str] | None = None,
) -> list[Found]:
    """Run the import probe over ``entries`` on ``tree``; one result per entry.

    ``python`` and ``env`` choose the interpreter that imports the tree's code
    (the PR verdict passes its sandbox's); by default, this one. ``only``:
    the source files to write out and import from (the verdict's owned
    modules); by default every ``packages/*/src`` file. The tree is written
    out, and the probe runs, in ``env``'s ``TMPDIR`` (the sandbox's scratch).
    """
    if not entries:
        return []
    where = (env or {}).get("TMPDIR")
    with tempfile.TemporaryDirectory(prefix="contracts-api-", dir=where) as tmp:
        if isinstance(tree, WorkingTree) and only is None:
            base = tree.root
        else:
            base = Path(tmp) / "tree"
            wanted = set(only) if only is not None else None
            tree.materialize(
                [
                    f
                    for f in tree.files()
                    if SRC_FILES.match_file(f) and (wanted is None or f in wanted)
                ],
                base,
            )
        roots = sorted(str(p) for p in base.glob("packages/*/src") if p.is_dir())
        request = {"roots": roots, "tree": str(base), "entries": [_request(e) for e in entries]}
        try:
            done = subprocess.run(
                [
                    python,
                    "-P",
                    "-c",
                    PROBE.read_text(encoding="utf-8"),
                    json.dumps(request),
                ],
                capture_output=True,
                text=True,
                cwd=tmp,
                env=dict(env) if env is not None else None,
                timeout=TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            why = f"import probe timed out after {TIMEOUT_S} s"
            return [Found(e.object, probe_error=why, timed_out=True) for e in entries]
        return read_answer(done.returncode, done.stdout, done.stderr, entries)


def read_answer(code: int, stdout: str, stderr: str, entries: list[ApiEntry]) -> list[Found]:
    """The probe's answers for ``entries``, in order; where the probe failed, or
    answered with another shape or for other objects, a ``probe_error`` for each."""
    tail = one_line(last_line(stderr) or "no output")
    if code != 0 or not last_line(stdout):
        why = f"import probe failed (exit {code}): {tail}"
        return [Found(e.object, probe_error=why) for e in entries]
    try:
        found = decode(last_line(stdout), list[Found], "expected one answer per API entry")
        wanted, got = [e.object for e in entries], [f.object for f in found]
        if got != wanted:
            raise Malformed(one_line(f"expected answers for {wanted}, found {got}"))
    except Malformed as err:
        why = f"import probe answered something else ({err}): {tail}"
        return [Found(e.object, probe_error=why) for e in entries]
    return found


def judge(spec: Spec, entry: ApiEntry, found: Found, tree: Tree | None = None) -> list[Violation]:
    """Violations of one API entry given what the probe found.

    With ``tree``, every function and method is also read from its source
    (``api_source``): a signature that ``inspect`` and the ``def`` disagree on
    is ``api.source``.
    """
    out: list[Violation] = []
    path, line = found.file, found.line

    def add(rule: str, message: str, at: tuple[str | None, int | None] | None = None) -> None:
        p, n = at if at is not None else (path, line)
        out.append(Violation(rule, p, n, f"{entry.object}: {message}", spec.id, "api"))

    if found.probe_error is not None:
        add(API_PROBE.id, found.probe_error)
        return out
    if found.error is not None:
        add(API_MISSING.id, f"expected a {entry.kind}, found: {found.error}")
        return out
    if found.kind != entry.kind:
        add(API_KIND.id, f"expected a {entry.kind}, found a {found.kind}")
        return out
    if entry.signature is not None:
        if found.signature is None:
            why = found.signature_error or "the probe sent none"
            add(API_SIGNATURE.id, f"signature cannot be read: {why}")
        else:
            inspected = found.signature.data()
            for diff in compare_signatures(parse_signature(entry.signature), inspected):
                add(API_SIGNATURE.id, diff)
            if tree is not None:
                for rule, message, p, n in judge_source("", inspected, found.source, tree):
                    add(rule, message, (p or path, n or line))
    for name, text in entry.methods.items():
        got = found.methods.get(name, Method(error="not probed"))
        if got.signature is None:
            add(API_SIGNATURE.id, f"expected method {name}{text}, found: {got.error}")
            continue
        at = got.where or (path, line)
        inspected = got.signature.data()
        for diff in compare_signatures(
            parse_signature(text), inspected, is_init=name == "__init__"
        ):
            add(API_SIGNATURE.id, f"{name}: {diff}", at)
        if tree is not None:
            for rule, message, p, n in judge_source(
                f"{name}: ", inspected, got.source, tree, is_init=name == "__init__"
            ):
                add(rule, message, (p or at[0], n or at[1]))
    if entry.fields is not None:
        expected = {k: norm(ast.parse(v, mode="eval").body) for k, v in entry.fields.items()}
        if expected != found.fields:
            add(API_FIELDS.id, f"expected fields {expected}, found {found.fields}")
    if entry.exports is not None:
        want = sorted(entry.exports)
        if found.all is None:
            add(API_EXPORTS.id, f"expected __all__ = {want}, found no __all__")
        elif sorted(found.all) != want:
            add(API_EXPORTS.id, f"expected __all__ = {want}, found {sorted(found.all)}")
        extra = sorted(set(found.public) - set(entry.exports))
        if extra:
            add(
                API_EXPORTS.id,
                f"expected public definitions only among {want}, found also "
                f"{extra} (make them private or list them)",
            )
    if entry.same_as is not None:
        if found.same_error is not None:
            add(
                API_IDENTITY.id,
                f"expected the same object as {entry.same_as}, found: {found.same_error}",
            )
        elif not found.same:
            add(
                API_IDENTITY.id,
                f"expected the very object {entry.same_as} (a re-export), found a different object",
            )
    return out


def check_api(
    specs: list[Spec],
    tree: Tree,
    python: str = sys.executable,
    env: Mapping[str, str] | None = None,
    only: Collection[str] | None = None,
    base: tuple[Tree, Collection[str] | None] | None = None,
) -> dict[str, list[Violation]]:
    """API violations per stage, one probe for all of ``specs`` (see ``probe`` for the rest).

    With ``base`` (the PR gate: the base's tree and its owned files), a probe
    that timed out on ``tree`` is run on the base's code too: if the base's
    times out as well, the machine, not the PR, is too slow to judge.

    Raises:
        ConfigError: the probe timed out on the PR's code and on the base's.
    """
    entries = [(s, e) for s in specs for e in s.api]
    results = probe(tree, [e for _, e in entries], python, env, only)
    if base is not None and any(r.timed_out for r in results):
        again = probe(base[0], [e for _, e in entries], python, env, base[1])
        if any(r.timed_out for r in again):
            raise ConfigError(
                f"could not judge: the import probe timed out after {TIMEOUT_S} s on the PR's "
                "code and on the base's (the machine is too busy, not the PR too slow)"
            )
        answered = ", where the base's code answered in time"
        results = [
            msgspec.structs.replace(r, probe_error=f"{r.probe_error}{answered}")
            if r.timed_out
            else r
            for r in results
        ]
    out: dict[str, list[Violation]] = {s.id: [] for s in specs}
    for (spec, entry), found in zip(entries, results, strict=True):
        out[spec.id].extend(judge(spec, entry, found, tree))
    return out
