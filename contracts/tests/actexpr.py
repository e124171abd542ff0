"""GitHub Actions expressions, the subset ``.github/workflows/contracts.yml`` uses.

Literals (``'text'`` with ``''`` for a quote, ``true``, ``false``, ``null``),
contexts with property access (``github.event.pull_request.head.sha``,
``vars.X``, ``runner.temp``, ``env.X``, ``steps.<id>.outputs.<name>``), ``!``,
``==``, ``!=``, ``&&``, ``||``, parentheses, and the functions ``hashFiles``,
``success``, ``failure``, ``always``. As on GitHub: a missing property is
``null``; ``&&`` and ``||`` return an operand, not a boolean; ``==`` compares
strings ignoring case and coerces values of different types to numbers
(``null`` and ``''`` are 0); falsy are ``false``, ``0``, ``''``, ``null``;
``${{ }}`` in a string puts the value's text there (``null`` is empty).

Anything else (numbers, ``<``, indexing, other functions, an unknown
context) raises ``Unsupported``: the replay fails rather than guess.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

CONTEXTS = ("github", "vars", "runner", "env", "steps")
_TOKEN = re.compile(
    r"\s*(?:(?P<str>'(?:[^']|'')*')|(?P<op>==|!=|&&|\|\||[!().,])|(?P<word>[A-Za-z_][\w-]*))"
)
_EXPR = re.compile(r"\$\{\{(.*?)\}\}", re.DOTALL)


class Unsupported(Exception):
    """Something the replay cannot emulate: the test fails, it never skips."""


def _tokens(text: str) -> list[tuple[str, str]]:
    out, pos = [], 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        m = _TOKEN.match(text, pos)
        if m is None:
            raise Unsupported(f"expression {text!r}: cannot read {text[pos:]!r}")
        kind = m.lastgroup or ""
        out.append((kind, m.group(kind)))
        pos = m.end()
    return out


def truthy(value: Any) -> bool:
    return value not in (None, False, 0, "") and not (
        isinstance(value, float) and math.isnan(value)
    )


def text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value
    raise Unsupported(f"cannot put {value!r} into a string")


def _number(value: Any) -> float:
    if value is None or value is False:
        return 0.0
    if value is True:
        return 1.0
    if isinstance(value, str):
        if value.strip() == "":
            return 0.0
        try:
            return float(value)
        except ValueError:
            return math.nan
    return math.nan


def _equal(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.casefold() == b.casefold()
    if type(a) is type(b) and not isinstance(a, (dict, list)):
        return bool(a == b)
    return _number(a) == _number(b)


class Evaluator:
    """Evaluates expressions against ``contexts``; ``workspace`` roots ``hashFiles``."""

    def __init__(self, contexts: Mapping[str, Any], workspace: Path, status: str = "success"):
        self.contexts = contexts
        self.workspace = workspace
        self.status = status
        self.functions: dict[str, Callable[..., Any]] = {
            "hashFiles": self._hash_files,
            "success": lambda: self.status == "success",
            "failure": lambda: self.status == "failure",
            "always": lambda: True,
        }

    def evaluate(self, expression: str) -> Any:
        self._toks, self._at = _tokens(expression), 0
        value = self._or()
        if self._at != len(self._toks):
            raise Unsupported(f"expression {expression!r}: unexpected {self._toks[self._at][1]!r}")
        return value

    def interpolate(self, value: str) -> str:
        """A workflow string with each ``${{ expression }}`` replaced by its text."""
        return _EXPR.sub(lambda m: text(self.evaluate(m.group(1))), value)

    def condition(self, expression: str | bool | None) -> bool:
        """An ``if:``: ``${{ }}`` optional; without a status function, ``success() && (...)``."""
        if expression is None:
            return self.status == "success"
        if isinstance(expression, bool):
            return expression
        body = expression.strip()
        m = _EXPR.fullmatch(body)
        body = m.group(1) if m else body
        if not re.search(r"\b(success|failure|always|cancelled)\(", body):
            body = f"success() && ({body})"
        return truthy(self.evaluate(body))

    # --- the grammar: or > and > equality > not > primary ----------------------

    def _peek(self) -> str | None:
        return self._toks[self._at][1] if self._at < len(self._toks) else None

    def _take(self, want: str | None = None) -> tuple[str, str]:
        if self._at >= len(self._toks):
            raise Unsupported("expression ends too early")
        tok = self._toks[self._at]
        if want is not None and tok[1] != want:
            raise Unsupported(f"expected {want!r}, found {tok[1]!r}")
        self._at += 1
        return tok

    def _or(self) -> Any:
        value = self._and()
        while self._peek() == "||":
            self._take()
            right = self._and()
            value = value if truthy(value) else right
        return value

    def _and(self) -> Any:
        value = self._equality()
        while self._peek() == "&&":
            self._take()
            right = self._equality()
            value = right if truthy(value) else value
        return value

    def _equality(self) -> Any:
        value = self._not()
        if self._peek() in ("==", "!="):
            op = self._take()[1]
            same = _equal(value, self._not())
            return same if op == "==" else not same
        return value

    def _not(self) -> Any:
        if self._peek() == "!":
            self._take()
            return not truthy(self._not())
        return self._primary()

    def _primary(self) -> Any:
        kind, tok = self._take()
        if kind == "str":
            return tok[1:-1].replace("''", "'")
        if tok == "(":
            value = self._or()
            self._take(")")
            return value
        if kind != "word":
            raise Unsupported(f"unexpected {tok!r}")
        if tok in ("true", "false", "null"):
            return {"true": True, "false": False, "null": None}[tok]
        if self._peek() == "(":
            return self._call(tok)
        if tok not in CONTEXTS or tok not in self.contexts:
            raise Unsupported(f"context {tok!r} is not emulated")
        value: Any = self.contexts[tok]
        while self._peek() == ".":
            self._take()
            _, name = self._take()
            value = value.get(name) if isinstance(value, dict) else None
        return value

    def _call(self, name: str) -> Any:
        if name not in self.functions:
            raise Unsupported(f"function {name}() is not emulated")
        self._take("(")
        args = []
        while self._peek() != ")":
            args.append(self._or())
            if self._peek() == ",":
                self._take()
        self._take(")")
        return self.functions[name](*args)

    def _hash_files(self, *patterns: str) -> str:
        """As GitHub: the SHA-256 of each matched file's SHA-256, '' when none match."""
        files = sorted(
            {p for pattern in patterns for p in self.workspace.glob(pattern) if p.is_file()}
        )
        if not files:
            return ""
        digest = hashlib.sha256()
        for path in files:
            digest.update(hashlib.sha256(path.read_bytes()).digest())
        return digest.hexdigest()
