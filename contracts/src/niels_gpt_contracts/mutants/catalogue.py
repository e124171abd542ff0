"""The mutant catalogue: ``[[mutants]]`` entries of the stage specs, and how
each one is applied to the current source.

A mutant is a literal patch: ``find`` must occur in ``file`` exactly once (or,
with ``occurrence = N``, at least N times; the N-th is replaced). When it does
not, the code has moved on and the mutant is *stale*: it is reported, never
counted as killed, and fails the gate until its ``find`` is rewritten.

The patched module is never written into the working tree. It goes to an
overlay directory that mirrors its import path (``<overlay>/niels_gpt/model/
rope.py`` for ``packages/rope/src/niels_gpt/model/rope.py``); put first on
``PYTHONPATH``, that copy wins over the installed one because ``niels_gpt`` and
``niels_gpt.model`` are PEP 420 namespace packages. A module inside a regular
package (a stage's named module, ``attention/causal.py``) takes a copy of that
package with it, since Python finds the module through its package.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from niels_gpt_contracts.errors import SpecError, SpecErrors
from niels_gpt_contracts.stagespec import Spec, import_name
from niels_gpt_contracts.tomllines import key_lines, line_of

SRC_MARKER = "/src/"


@dataclass(frozen=True)
class Mutant:
    """One catalogued bug of a stage."""

    stage: str
    id: str
    text: str
    file: str
    find: str
    replace: str
    occurrence: int | None
    spec_path: str
    line: int | None
    retarget: bool = False  # marked by an amendment: its stage PR rewrites the code it patches

    @property
    def name(self) -> str:
        return f"{self.stage}.{self.id}"

    @property
    def src_dir(self) -> str:
        """The ``src`` directory that holds the file (``packages/<pkg>/src``)."""
        return self.file.split(SRC_MARKER, 1)[0] + SRC_MARKER.rstrip("/")

    @property
    def module_path(self) -> str:
        """The file's path below its ``src/`` directory (its import path)."""
        return self.file.split(SRC_MARKER, 1)[1]

    @property
    def module(self) -> str:
        return import_name(self.module_path)


@dataclass(frozen=True)
class Applied:
    """The outcome of applying a mutant: mutated text, or why it cannot be."""

    source: str | None
    stale: str | None = None


def catalogue(spec: Spec, spec_text: str | None = None) -> list[Mutant]:
    """The stage's mutants, checked beyond the schema (unique ids, a real patch).

    Raises:
        SpecErrors: duplicate ids, ``find == replace`` or a file outside ``src/``.
    """
    lines = key_lines(spec_text) if spec_text is not None else {}
    errors: list[SpecError] = []
    out: list[Mutant] = []
    seen: set[str] = set()
    for i, raw in enumerate(spec.mutants):
        entry: Mapping[str, Any] = raw
        line = line_of(lines, ("mutants", i)) if lines else None
        mid = str(entry["id"])
        if mid in seen:
            errors.append(
                SpecError(
                    spec.path,
                    f"mutants[{i}].id",
                    line,
                    f"expected a unique id, found {mid!r} again",
                )
            )
        seen.add(mid)
        if entry["find"] == entry["replace"]:
            errors.append(
                SpecError(
                    spec.path,
                    f"mutants[{i}].replace",
                    line,
                    "expected a change, found replace == find",
                )
            )
        file = str(entry["file"])
        if SRC_MARKER not in file or not file.endswith(".py"):
            errors.append(
                SpecError(
                    spec.path,
                    f"mutants[{i}].file",
                    line,
                    f"expected a module under a package's src/, found {file!r}",
                )
            )
            continue
        occurrence = entry.get("occurrence")
        out.append(
            Mutant(
                stage=spec.id,
                id=mid,
                text=str(entry["text"]),
                file=file,
                find=str(entry["find"]),
                replace=str(entry["replace"]),
                occurrence=int(occurrence) if occurrence is not None else None,
                spec_path=spec.path,
                line=line,
                retarget=bool(entry.get("retarget", False)),
            )
        )
    if errors:
        raise SpecErrors(errors)
    return out


def apply(mutant: Mutant, source: str | None) -> Applied:
    """Patch ``source`` (the current text of ``mutant.file``), or say why it is stale."""
    if source is None:
        return Applied(None, f"{mutant.file} is missing or not a text file")
    count = source.count(mutant.find)
    if mutant.occurrence is None:
        if count != 1:
            return Applied(None, f"find occurs {count} times in {mutant.file}, expected once")
        return Applied(source.replace(mutant.find, mutant.replace, 1))
    if count < mutant.occurrence:
        return Applied(
            None,
            f"find occurs {count} times in {mutant.file}, expected at least {mutant.occurrence}",
        )
    start = -1
    for _ in range(mutant.occurrence):
        start = source.index(mutant.find, start + 1)
    return Applied(source[:start] + mutant.replace + source[start + len(mutant.find) :])


def compile_problem(mutant: Mutant, source: str) -> str | None:
    """A syntax error in the mutated module is a broken catalogue entry, not a kill."""
    try:
        compile(source, mutant.file, "exec", dont_inherit=True)
    except SyntaxError as err:
        return f"the mutated {mutant.file} does not compile: {err.msg} (line {err.lineno})"
    return None


def write_overlay(mutant: Mutant, source: str, overlay: Path, sources: Path | None = None) -> Path:
    """Write the mutated module under ``overlay`` at its import path; return its path.

    A module inside a regular package (a stage's named module beside the
    ``__init__.py`` that re-exports it) is found through its package, and the
    tree's package would win over a bare directory in the overlay: so the
    outermost regular package around the module (the first directory below the
    namespace packages that has an ``__init__.py``) is first copied whole from
    ``sources``, the tree that holds ``mutant.file``, and the mutated module then
    written over its copy.
    """
    target = overlay / mutant.module_path
    if sources is not None:
        src = sources / mutant.src_dir
        parts = Path(mutant.module_path).parts[:-1]
        for depth in range(1, len(parts) + 1):
            package = src.joinpath(*parts[:depth])
            if (package / "__init__.py").is_file():
                skip = shutil.ignore_patterns("__pycache__", "*.pyc")
                shutil.copytree(package, overlay.joinpath(*parts[:depth]), ignore=skip)
                break
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(source, encoding="utf-8")
    return target


def by_stage(mutants: Iterable[Mutant]) -> dict[str, list[Mutant]]:
    grouped: dict[str, list[Mutant]] = {}
    for m in mutants:
        grouped.setdefault(m.stage, []).append(m)
    return grouped
