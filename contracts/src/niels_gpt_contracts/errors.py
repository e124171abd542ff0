"""Errors that stop the gate before it can judge anything (exit status 2).

A ``ConfigError`` is never a verdict: an unknown stage, an unreadable or
malformed spec, a base revision that does not exist, a directory that is not a
git repository. The CLI prints its one-line reason and exits 2, so an error can
never be mistaken for a pass (0) or for a broken contract (1).
"""

from __future__ import annotations


class ConfigError(Exception):
    """The gate cannot run as asked; ``str(err)`` is a one-line reason."""


class SpecError(ConfigError):
    """A spec file is unreadable or malformed.

    Attributes:
        path: the spec file, relative to the repository root.
        key: the dotted key path that is wrong (``""`` for a syntax error).
        line: 1-based line in the file, or ``None`` when it cannot be placed.
        problem: what was expected and what was found.
    """

    def __init__(self, path: str, key: str, line: int | None, problem: str) -> None:
        self.path = path
        self.key = key
        self.line = line
        self.problem = problem
        where = f"{path}:{line}" if line is not None else path
        what = f"key '{key}': " if key else ""
        super().__init__(f"{where}: {what}{problem}")


class SpecErrors(ConfigError):
    """Several spec errors found at once (every one is reported)."""

    def __init__(self, errors: list[SpecError]) -> None:
        self.errors = errors
        super().__init__("; ".join(str(e) for e in errors))
