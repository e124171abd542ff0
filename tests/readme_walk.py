"""A README read the way a new user reads it: install lines, then the examples below them.

A README is cut into *walks*. A walk starts at a shell block whose ``pip
install`` names a ``niels-gpt-*`` distribution (an install line) and holds
every Python block after it, up to the next install line of the same file:
those examples must run in an environment made by that install line and
nothing else. A shell block runs too when the line just before it is the
comment ``<!-- test-readmes: run -->`` (a ``niels-train --quick`` a later
example reads, say); other shell blocks (nox, long trainings) are read, not
run. A Python block with no install line above it is an error: a user would
not know what to install.

Only the parts of an install line that a test can honour are accepted:
``-c constraints.txt``, ``--find-links dist`` (the wheels ``nox -s build``
writes), ``--extra-index-url`` (PyTorch's CPU index, dropped: the test brings
torch itself) and requirement names. Anything else (a path, a URL, another
option) raises ``ReadmeError``, so an install line cannot drift out of what
the test checks without the test saying so.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt
from packaging.requirements import InvalidRequirement, Requirement

__all__ = ["RUN_MARKER", "Install", "ReadmeError", "Step", "Walk", "parse_install", "walks"]

RUN_MARKER = "<!-- test-readmes: run -->"
STAGE_PREFIX = "niels-gpt-"
_SHELL = ("bash", "sh", "shell", "console")
_PIP = (("pip", "install"), ("python", "-m", "pip", "install"), ("python3", "-m", "pip", "install"))
_TAKES_VALUE = {"-c", "--constraint", "--find-links", "-f", "--extra-index-url"}


class ReadmeError(ValueError):
    """A README block the walk cannot honour; the message names the file and line."""


@dataclass(frozen=True)
class Install:
    """One ``pip install`` line: its requirements and the options it gave."""

    requirements: tuple[str, ...]
    constraints: bool  # -c constraints.txt
    find_links: bool  # --find-links dist
    brings: tuple[str, ...] | None = None  # "# ...; brings a, b and c" on the line, if said


@dataclass(frozen=True)
class Step:
    """A block to run: ``syntax`` is ``python`` or ``bash``; ``line`` is 1-based."""

    syntax: str
    code: str
    line: int


@dataclass(frozen=True)
class Walk:
    """An install line and the blocks that run after it, in the order written."""

    readme: Path
    line: int
    install: Install
    steps: tuple[Step, ...]

    @property
    def name(self) -> str:
        return f"{self.readme.as_posix()}:{self.line}"


def _commands(code: str) -> list[tuple[list[str], tuple[str, ...] | None]]:
    """Shell lines as argument lists (comments dropped, continuations joined), each
    with what its comment says it brings (``# ...; brings core, rope and attention``)."""
    joined = re.sub(r"\\\n", " ", code)
    out = []
    for line in joined.splitlines():
        if words := shlex.split(line, comments=True):
            said = re.search(r"#.*\bbrings ([^#;]+)$", line)
            items = re.split(r",\s*|\s+and\s+", said.group(1).strip()) if said else None
            out.append((words, tuple(items) if items else None))
    return out


def parse_install(
    words: list[str], where: str, brings: tuple[str, ...] | None = None
) -> Install | None:
    """The ``Install`` of one command, or ``None`` if it installs no niels-gpt distribution.

    Raises:
        ReadmeError: an option or requirement the test cannot reproduce.
    """
    prefix = next((p for p in _PIP if tuple(words[: len(p)]) == p), None)
    if prefix is None:
        return None
    args, reqs, constraints, find_links = words[len(prefix) :], [], False, False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in _TAKES_VALUE:
            value = args[i + 1] if i + 1 < len(args) else ""
            if arg in ("-c", "--constraint"):
                if value != "constraints.txt":
                    raise ReadmeError(f"{where}: expected -c constraints.txt, got -c {value!r}")
                constraints = True
            elif arg in ("--find-links", "-f"):
                if value != "dist":
                    raise ReadmeError(f"{where}: expected --find-links dist, got {value!r}")
                find_links = True
            i += 2
            continue
        if arg.startswith("-"):
            raise ReadmeError(f"{where}: pip option {arg!r} is not one the README test reproduces")
        try:
            req = Requirement(arg)
        except InvalidRequirement:
            raise ReadmeError(
                f"{where}: expected a distribution name, got {arg!r} (a path or URL installs "
                "what the wheels in dist/ do not show)"
            ) from None
        reqs.append(str(req))
        i += 1
    if not any(Requirement(r).name.startswith(STAGE_PREFIX) for r in reqs):
        return None  # tooling (nox), not the package under test
    return Install(tuple(reqs), constraints, find_links, brings)


def walks(readme: Path, root: Path) -> list[Walk]:
    """The walks of one README (``root`` makes the names relative).

    Raises:
        ReadmeError: a Python block before any install line, an install line in
            a block marked to run, or an install line the test cannot reproduce.
    """
    text = readme.read_text()
    rel = readme.relative_to(root)
    found: list[Walk] = []
    current: tuple[int, Install, list[Step]] | None = None
    previous = ""
    for token in MarkdownIt("commonmark").parse(text):
        marked = previous == RUN_MARKER
        previous = token.content.strip() if token.type == "html_block" else ""
        if token.type != "fence" or token.map is None:
            continue
        line = token.map[0] + 1
        where = f"{rel.as_posix()}:{line}"
        syntax = token.info.strip().split(" ")[0].lower()
        if syntax in _SHELL:
            commands = _commands(token.content)
            installs = [i for w, b in commands if (i := parse_install(w, where, b))]
            if installs and marked:
                raise ReadmeError(f"{where}: an install block cannot also be marked to run")
            if len(installs) > 1:
                raise ReadmeError(f"{where}: one install line a block, got {len(installs)}")
            if installs:
                if current is not None:
                    found.append(Walk(rel, current[0], current[1], tuple(current[2])))
                current = (line, installs[0], [])
            elif marked:
                if current is None:
                    raise ReadmeError(f"{where}: a block to run, but no install line above it")
                current[2].append(Step("bash", token.content, line))
        elif syntax == "python":
            if current is None:
                raise ReadmeError(
                    f"{where}: a Python example with no install line above it (expected a "
                    f"shell block with `pip install ... {STAGE_PREFIX}<stage>`)"
                )
            current[2].append(Step("python", token.content, line))
    if current is not None:
        found.append(Walk(rel, current[0], current[1], tuple(current[2])))
    return found
