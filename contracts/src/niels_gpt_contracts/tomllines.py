"""Map TOML key paths to the line they are written on.

``tomllib`` returns values without positions, but a malformed spec must name
its line. ``key_lines`` re-scans text that ``tomllib`` already accepted and
records, for every key path (``("api", 2, "methods", "forward")``), the 1-based
line where it is defined: tables, array-of-tables entries, dotted keys, inline
tables and array elements. It is a position finder, not a parser: it never
judges the text, and on anything it does not follow it stops and returns what
it has.
"""

from __future__ import annotations

import contextlib

KeyPath = tuple[str | int, ...]

_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-")


class _Scanner:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.line = 1
        self.lines: dict[KeyPath, int] = {}
        self.aot_last: dict[KeyPath, int] = {}

    # -- low level -------------------------------------------------------

    def peek(self, n: int = 1) -> str:
        return self.s[self.i : self.i + n]

    def advance(self, n: int = 1) -> None:
        chunk = self.s[self.i : self.i + n]
        self.line += chunk.count("\n")
        self.i += n

    def skip_space(self, newlines: bool) -> None:
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t\r" or (newlines and c == "\n"):
                self.advance()
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] != "\n":
                    self.advance()
            else:
                return

    def record(self, path: KeyPath) -> None:
        self.lines.setdefault(path, self.line)

    # -- keys and values -------------------------------------------------

    def string(self) -> str:
        if self.peek(3) in ('"""', "'''"):
            quote = self.peek(3)
            self.advance(3)
            start = self.i
            while self.i < len(self.s) and self.peek(3) != quote:
                self.advance(2 if quote == '"""' and self.peek() == "\\" else 1)
            text = self.s[start : self.i]
            self.advance(3)
            while self.peek() == quote[0]:  # up to two quotes may end the content
                self.advance()
            return text
        quote = self.peek()
        self.advance()
        start = self.i
        while self.i < len(self.s) and self.s[self.i] != quote:
            self.advance(2 if quote == '"' and self.s[self.i] == "\\" else 1)
        text = self.s[start : self.i]
        self.advance()
        return text

    def key(self) -> tuple[str, ...]:
        parts: list[str] = []
        while True:
            self.skip_space(newlines=False)
            if self.peek() in ('"', "'"):
                parts.append(self.string())
            else:
                start = self.i
                while self.i < len(self.s) and self.s[self.i] in _BARE:
                    self.advance()
                if self.i == start:
                    raise ValueError("not a key")
                parts.append(self.s[start : self.i])
            self.skip_space(newlines=False)
            if self.peek() != ".":
                return tuple(parts)
            self.advance()

    def value(self, path: KeyPath) -> None:
        c = self.peek()
        if c in ('"', "'"):
            self.string()
        elif c == "[":
            self.advance()
            index = 0
            while True:
                self.skip_space(newlines=True)
                if self.peek() in ("]", ""):
                    self.advance()
                    return
                self.record((*path, index))
                self.value((*path, index))
                self.skip_space(newlines=True)
                if self.peek() == ",":
                    self.advance()
                    index += 1
        elif c == "{":
            self.advance()
            while True:
                self.skip_space(newlines=False)
                if self.peek() in ("}", ""):
                    self.advance()
                    return
                if self.peek() == ",":
                    self.advance()
                    continue
                sub = (*path, *self.key())
                self.record(sub)
                self.skip_space(newlines=False)
                self.advance()  # '='
                self.skip_space(newlines=False)
                self.value(sub)
        else:
            while self.i < len(self.s) and self.s[self.i] not in ",]}\n#":
                self.advance()

    def canonical(self, key: tuple[str, ...]) -> KeyPath:
        path: KeyPath = ()
        for part in key:
            path = (*path, part)
            if path in self.aot_last:
                path = (*path, self.aot_last[path])
        return path

    # -- document ---------------------------------------------------------

    def run(self) -> None:
        table: KeyPath = ()
        while True:
            self.skip_space(newlines=True)
            if self.i >= len(self.s):
                return
            if self.peek(2) == "[[":
                self.advance(2)
                key = self.key()
                parent = self.canonical(key[:-1])
                array = (*parent, key[-1])
                self.record(array)
                index = self.aot_last.get(array, -1) + 1
                self.aot_last[array] = index
                table = (*array, index)
                self.record(table)
            elif self.peek() == "[":
                self.advance()
                table = self.canonical(self.key())
                self.record(table)
            else:
                path = (*table, *self.key())
                self.record(path)
                self.skip_space(newlines=False)
                self.advance()  # '='
                self.skip_space(newlines=False)
                self.value(path)
                continue
            while self.i < len(self.s) and self.s[self.i] != "\n":
                self.advance()


def key_lines(text: str) -> dict[KeyPath, int]:
    """Line of every key path in ``text`` (valid TOML); partial on surprises."""
    scanner = _Scanner(text)
    with contextlib.suppress(ValueError, IndexError):
        scanner.run()
    return scanner.lines


def line_of(lines: dict[KeyPath, int], path: KeyPath) -> int | None:
    """The line of ``path``, or of its longest recorded prefix."""
    for end in range(len(path), 0, -1):
        if path[:end] in lines:
            return lines[path[:end]]
    return None


def dotted(path: KeyPath) -> str:
    """``("api", 2, "methods")`` -> ``api[2].methods``."""
    out = ""
    for part in path:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else part
    return out or "(top level)"
