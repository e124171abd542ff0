"""The public API check: import each listed object and compare it with the spec.

The import happens in a fresh interpreter (``_probe.py``) whose path starts
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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from niels_gpt_contracts.gitdiff import Tree, WorkingTree
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.spec import ApiEntry, Spec, compile_patterns

PROBE = Path(__file__).with_name("_probe.py")
SRC_FILES = compile_patterns(["/packages/*/src/**/*.py"])
TIMEOUT_S = 300

_KIND = {
    "POSITIONAL_ONLY": "positional-only",
    "POSITIONAL_OR_KEYWORD": "positional-or-keyword",
    "VAR_POSITIONAL": "*args",
    "KEYWORD_ONLY": "keyword-only",
    "VAR_KEYWORD": "**kwargs",
}


def _norm(node: ast.expr | None, unquote: bool = True) -> str | None:
    """Canonical spelling, as the probe writes it (quoted annotations unquoted)."""
    if node is None:
        return None
    try:
        while unquote and isinstance(node, ast.Constant) and isinstance(node.value, str):
            node = ast.parse(node.value.strip(), mode="eval").body
    except SyntaxError:
        pass
    return ast.unparse(node)


def parse_signature(text: str) -> dict[str, Any]:
    """The spec's signature text in the probe's normalised form."""
    func = ast.parse(f"def _f{text}:\n    pass\n").body[0]
    assert isinstance(func, ast.FunctionDef)
    a = func.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
    defaults += list(a.defaults)
    params: list[list[str | None]] = []
    for i, arg in enumerate(positional):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        params.append([arg.arg, kind, _norm(defaults[i], False), _norm(arg.annotation)])
    if a.vararg:
        params.append([a.vararg.arg, "VAR_POSITIONAL", None, _norm(a.vararg.annotation)])
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append([arg.arg, "KEYWORD_ONLY", _norm(default, False), _norm(arg.annotation)])
    if a.kwarg:
        params.append([a.kwarg.arg, "VAR_KEYWORD", None, _norm(a.kwarg.annotation)])
    return {"params": params, "return": _norm(func.returns)}


def _render(sig: Mapping[str, Any]) -> str:
    parts = []
    for name, kind, default, ann in sig["params"]:
        text = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(kind, "") + name
        text += f": {ann}" if ann else ""
        text += (" = " if ann else "=") + default if default is not None else ""
        parts.append(text)
    ret = f" -> {sig['return']}" if sig["return"] else ""
    return f"({', '.join(parts)}){ret}"


def compare_signatures(
    expected: Mapping[str, Any], found: Mapping[str, Any], is_init: bool = False
) -> list[str]:
    """Differences, each 'expected ..., found ...'; empty when equal."""
    diffs: list[str] = []
    exp_names = [p[0] for p in expected["params"]]
    got_names = [p[0] for p in found["params"]]
    if exp_names != got_names:
        return [
            f"expected parameters ({', '.join(exp_names)}), found "
            f"({', '.join(got_names)}): expected {_render(expected)}, found {_render(found)}"
        ]
    for exp, got in zip(expected["params"], found["params"], strict=True):
        name = exp[0]
        if exp[1] != got[1]:
            diffs.append(f"parameter {name!r}: expected {_KIND[exp[1]]}, found {_KIND[got[1]]}")
        if exp[2] != got[2]:
            diffs.append(
                f"parameter {name!r}: expected default {exp[2] or '(none)'}, found "
                f"{got[2] or '(none)'}"
            )
        if exp[3] != got[3]:
            diffs.append(
                f"parameter {name!r}: expected annotation {exp[3] or '(none)'}, "
                f"found {got[3] or '(none)'}"
            )
    exp_ret, got_ret = expected["return"], found["return"]
    if is_init:
        exp_ret, got_ret = exp_ret or "None", got_ret or "None"
    if exp_ret != got_ret:
        diffs.append(
            f"return annotation: expected {exp_ret or '(none)'}, found {got_ret or '(none)'}"
        )
    return diffs


def _request(entry: ApiEntry) -> dict[str, Any]:
    return {
        "object": entry.object,
        "signature": entry.signature is not None,
        "methods": list(entry.methods),
        "fields": entry.fields is not None,
        "exports": entry.exports is not None,
        "same_as": entry.same_as,
    }


def probe(tree: Tree, entries: list[ApiEntry]) -> list[dict[str, Any]]:
    """Run the import probe over ``entries`` on ``tree``; one result per entry."""
    if not entries:
        return []
    with tempfile.TemporaryDirectory(prefix="contracts-api-") as tmp:
        if isinstance(tree, WorkingTree):
            base = tree.root
        else:
            base = Path(tmp) / "tree"
            tree.materialize([f for f in tree.files() if SRC_FILES.match_file(f)], base)
        roots = sorted(str(p) for p in base.glob("packages/*/src") if p.is_dir())
        request = {"roots": roots, "tree": str(base), "entries": [_request(e) for e in entries]}
        try:
            done = subprocess.run(
                [
                    sys.executable,
                    "-P",
                    "-c",
                    PROBE.read_text(encoding="utf-8"),
                    json.dumps(request),
                ],
                capture_output=True,
                text=True,
                cwd=tmp,
                timeout=TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return [
                {"object": e.object, "probe_error": f"import probe timed out after {TIMEOUT_S} s"}
                for e in entries
            ]
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            return [
                {
                    "object": e.object,
                    "probe_error": f"import probe failed (exit {done.returncode}): {tail}",
                }
                for e in entries
            ]
        results: list[dict[str, Any]] = json.loads(lines[-1])
        return results


def judge(spec: Spec, entry: ApiEntry, found: Mapping[str, Any]) -> list[Violation]:
    """Violations of one API entry given what the probe found."""
    out: list[Violation] = []
    path: str | None = found.get("file")
    line: int | None = found.get("line")

    def add(rule: str, message: str, at: tuple[str | None, int | None] | None = None) -> None:
        p, n = at if at is not None else (path, line)
        out.append(Violation(rule, p, n, f"{entry.object}: {message}", spec.id, "api"))

    if "probe_error" in found:
        add("api.probe", found["probe_error"])
        return out
    if "error" in found:
        add("api.missing", f"expected a {entry.kind}, found: {found['error']}")
        return out
    if found["kind"] != entry.kind:
        add("api.kind", f"expected a {entry.kind}, found a {found['kind']}")
        return out
    if entry.signature is not None:
        if "signature_error" in found:
            add("api.signature", f"signature cannot be read: {found['signature_error']}")
        else:
            for diff in compare_signatures(parse_signature(entry.signature), found["signature"]):
                add("api.signature", diff)
    for name, text in entry.methods.items():
        got = found.get("methods", {}).get(name, {"error": "not probed"})
        if "error" in got:
            add("api.signature", f"expected method {name}{text}, found: {got['error']}")
            continue
        at = tuple(got.get("where") or (path, line))
        for diff in compare_signatures(
            parse_signature(text), got["signature"], is_init=name == "__init__"
        ):
            add("api.signature", f"{name}: {diff}", (at[0], at[1]))
    if entry.fields is not None:
        expected = {k: _norm(ast.parse(v, mode="eval").body) for k, v in entry.fields.items()}
        got_fields = found.get("fields", {})
        if expected != got_fields:
            add("api.fields", f"expected fields {expected}, found {got_fields}")
    if entry.exports is not None:
        exported, public = found.get("all"), found.get("public", [])
        want = sorted(entry.exports)
        if exported is None:
            add("api.exports", f"expected __all__ = {want}, found no __all__")
        elif sorted(exported) != want:
            add("api.exports", f"expected __all__ = {want}, found {sorted(exported)}")
        extra = sorted(set(public) - set(entry.exports))
        if extra:
            add(
                "api.exports",
                f"expected public definitions only among {want}, found also "
                f"{extra} (make them private or list them)",
            )
    if entry.same_as is not None:
        if "same_error" in found:
            add(
                "api.identity",
                f"expected the same object as {entry.same_as}, found: {found['same_error']}",
            )
        elif not found.get("same"):
            add(
                "api.identity",
                f"expected the very object {entry.same_as} (a re-export), found a different object",
            )
    return out


def check_api(specs: list[Spec], tree: Tree) -> dict[str, list[Violation]]:
    """API violations per stage, one probe for all of ``specs``."""
    entries = [(s, e) for s in specs for e in s.api]
    results = probe(tree, [e for _, e in entries])
    out: dict[str, list[Violation]] = {s.id: [] for s in specs}
    for (spec, entry), found in zip(entries, results, strict=True):
        out[spec.id].extend(judge(spec, entry, found))
    return out
