"""Signatures as data: parsed from spec text or from a ``def``, compared field by field.

A signature is ``{"params": [[name, kind, default, annotation], ...], "return": ...}``,
with ``kind`` an ``inspect.Parameter`` kind name and every expression spelled
canonically (``ast.parse`` then ``ast.unparse``, quoted annotations unquoted), so
``"str|torch.device"`` and ``str | torch.device`` are equal. The import probe
(``_api_probe.py``) writes the same form from ``inspect.signature``.

Not griffe: tried (2.4.1) on this tree, it read the stages' signatures as
``from_def`` does, but gives ``*args`` and ``**kwargs`` the defaults ``()`` and
``{}`` where ``inspect`` gives none, and reads a spec's signature text only
through a stub module; its breaking-change check reports neither a
parameter's nor the return's changed annotation (``a: int`` to ``a: str``),
which ``spec_diff`` calls BREAKING. It would replace about 40 lines here and
add a dependency.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from typing import Any

_KIND = {
    "POSITIONAL_ONLY": "positional-only",
    "POSITIONAL_OR_KEYWORD": "positional-or-keyword",
    "VAR_POSITIONAL": "*args",
    "KEYWORD_ONLY": "keyword-only",
    "VAR_KEYWORD": "**kwargs",
}


def norm(node: ast.expr | None, unquote: bool = True) -> str | None:
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
    return from_def(func)


def from_def(func: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, Any]:
    """A ``def`` statement's signature in the probe's normalised form."""
    a = func.args
    positional = [*a.posonlyargs, *a.args]
    defaults: list[ast.expr | None] = [None] * (len(positional) - len(a.defaults))
    defaults += list(a.defaults)
    params: list[list[str | None]] = []
    for i, arg in enumerate(positional):
        kind = "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD"
        params.append([arg.arg, kind, norm(defaults[i], False), norm(arg.annotation)])
    if a.vararg:
        params.append([a.vararg.arg, "VAR_POSITIONAL", None, norm(a.vararg.annotation)])
    for arg, default in zip(a.kwonlyargs, a.kw_defaults, strict=True):
        params.append([arg.arg, "KEYWORD_ONLY", norm(default, False), norm(arg.annotation)])
    if a.kwarg:
        params.append([a.kwarg.arg, "VAR_KEYWORD", None, norm(a.kwarg.annotation)])
    return {"params": params, "return": norm(func.returns)}


def render(sig: Mapping[str, Any]) -> str:
    """The signature as Python writes it, ``*`` and ``/`` markers included."""
    parts = []
    kinds = [p[1] for p in sig["params"]]
    for i, (name, kind, default, ann) in enumerate(sig["params"]):
        if (
            kind == "KEYWORD_ONLY"
            and "VAR_POSITIONAL" not in kinds
            and "KEYWORD_ONLY" not in kinds[:i]
        ):
            parts.append("*")
        if kind != "POSITIONAL_ONLY" and "POSITIONAL_ONLY" in kinds[i - 1 : i]:
            parts.append("/")
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
            f"({', '.join(got_names)}): expected {render(expected)}, found {render(found)}"
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
