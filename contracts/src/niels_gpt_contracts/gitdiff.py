"""The git adapter: revisions, changed paths and file contents, via ``git``.

Everything git prints about paths is read NUL-separated (``-z``), and paths
given to git are literal (``GIT_LITERAL_PATHSPECS=1``), so spaces, newlines,
glob characters and non-ASCII names pass through unchanged. Paths are decoded
as UTF-8 with ``surrogateescape`` so that no byte is lost.

A ``Tree`` is a set of files at one state: a commit (``RevisionTree``) or the
working tree (``WorkingTree``, tracked plus untracked-but-not-ignored files).
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from niels_gpt_contracts.errors import ConfigError

_ENV = {
    **os.environ,
    "GIT_LITERAL_PATHSPECS": "1",
    "LC_ALL": "C",
}
_HUNK = re.compile(rb"^@@ -\d+(?:,\d+)? \+(\d+)(?:,(\d+))? @@", re.MULTILINE)


def _decode(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


@dataclass(frozen=True)
class Change:
    """One entry of a diff.

    ``status`` is git's letter: A added, D deleted, M modified, T type change
    (file <-> symlink), R renamed, C copied, U unmerged. A rename has the old
    path in ``old_path``; both paths count as changed.
    """

    status: str
    path: str
    old_path: str | None = None

    def paths(self) -> tuple[str, ...]:
        return (self.path,) if self.old_path is None else (self.old_path, self.path)


class GitRepo:
    """A repository, driven through the ``git`` executable."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def discover(cls, where: Path) -> GitRepo:
        if shutil.which("git") is None:
            raise ConfigError("expected the git executable on PATH, found none")
        if not where.is_dir():
            raise ConfigError(f"expected a directory, found nothing at {where}")
        out = subprocess.run(
            ["git", "-C", str(where), "rev-parse", "--show-toplevel"],
            capture_output=True,
            env=_ENV,
            check=False,
        )
        if out.returncode != 0:
            raise ConfigError(f"expected a git repository at {where}, found none")
        return cls(Path(_decode(out.stdout).rstrip("\n")))

    def git(self, *args: str, stdin: bytes | None = None) -> bytes:
        out = subprocess.run(
            ["git", "-C", str(self.root), *args],
            input=stdin,
            capture_output=True,
            env=_ENV,
            check=False,
        )
        if out.returncode != 0:
            reason = _decode(out.stderr).strip().splitlines()
            raise ConfigError(
                f"git {' '.join(args[:3])} failed: {reason[0] if reason else 'no message'}"
            )
        return out.stdout

    def resolve(self, rev: str, what: str = "revision") -> str:
        """The full commit id of ``rev``; ConfigError when it names no commit."""
        out = subprocess.run(
            [
                "git",
                "-C",
                str(self.root),
                "rev-parse",
                "--verify",
                "--quiet",
                "--end-of-options",
                f"{rev}^{{commit}}",
            ],
            capture_output=True,
            env=_ENV,
            check=False,
        )
        if out.returncode != 0 or not out.stdout.strip():
            raise ConfigError(
                f"{what} {rev!r} not found: expected a commit in {self.root}, found none "
                "(fetch it, or pass a full SHA)"
            )
        return _decode(out.stdout).strip()

    def merge_base(self, a: str, b: str) -> str:
        out = subprocess.run(
            ["git", "-C", str(self.root), "merge-base", a, b],
            capture_output=True,
            env=_ENV,
            check=False,
        )
        if out.returncode != 0 or not out.stdout.strip():
            raise ConfigError(f"expected a common ancestor of {a[:12]} and {b[:12]}, found none")
        return _decode(out.stdout).strip()

    def changes(self, base: str, head: str | None) -> list[Change]:
        """Paths changed from ``base`` to ``head`` (working tree when ``None``)."""
        args = ["diff", "--name-status", "-z", "-M", "--no-ext-diff", "--no-textconv", base]
        if head is not None:
            args.append(head)
        tokens = self.git(*args).split(b"\0")
        changes: list[Change] = []
        i = 0
        while i < len(tokens) and tokens[i]:
            status = _decode(tokens[i])[:1]
            if status in ("R", "C"):
                changes.append(Change(status, _decode(tokens[i + 2]), _decode(tokens[i + 1])))
                i += 3
            else:
                changes.append(Change(status, _decode(tokens[i + 1])))
                i += 2
        if head is None:
            untracked = self.git("ls-files", "-z", "--others", "--exclude-standard")
            changes.extend(Change("A", _decode(p)) for p in untracked.split(b"\0") if p)
        return changes

    def changed_lines(self, base: str, head: str | None, path: str) -> set[int]:
        """Lines of ``path`` (numbered on the head side) that the diff adds."""
        args = ["diff", "-U0", "--no-ext-diff", "--no-textconv", "--no-color", base]
        if head is not None:
            args.append(head)
        out = self.git(*args, "--", path)
        lines: set[int] = set()
        for m in _HUNK.finditer(out):
            start, count = int(m.group(1)), int(m.group(2) or b"1")
            lines.update(range(start, start + count))
        return lines

    def stage_trailers(self, base: str, head: str) -> list[tuple[str, str]]:
        """``(commit, stage)`` for every ``Stage:`` trailer in ``base..head``."""
        return self.trailers(base, head, "Stage")

    def trailers(self, base: str, head: str, key: str) -> list[tuple[str, str]]:
        """``(commit, value)`` for every ``<key>:`` trailer in ``base..head``, oldest last."""
        out = self.git(
            "log",
            "-z",
            f"--format=%h%x1f%(trailers:key={key},valueonly,separator=%x1e)",
            f"{base}..{head}",
        )
        found: list[tuple[str, str]] = []
        for record in out.split(b"\0"):
            if not record.strip():
                continue
            commit, _, values = _decode(record).strip("\n").partition("\x1f")
            found.extend((commit, value) for value in _trailer_values(values))
        return found

    def history_trailers(
        self, rev: str, keys: Sequence[str], limit: int
    ) -> list[tuple[str, dict[str, list[str]]]]:
        """Per commit of ``rev``'s history, newest first (at most ``limit``), its hash
        and the values of each trailer in ``keys`` (``{key: [value, ...]}``)."""
        fmt = "%x1f".join(["%H", *(f"%(trailers:key={k},valueonly,separator=%x1e)" for k in keys)])
        out = self.git("log", "-z", f"-n{limit}", f"--format={fmt}", rev)
        found = []
        for record in out.split(b"\0"):
            commit, *parts = _decode(record).strip("\n").split("\x1f")
            if len(parts) == len(keys):
                values = {k: _trailer_values(v) for k, v in zip(keys, parts, strict=True)}
                found.append((commit, values))
        return found

    def changed_in(self, commit: str) -> set[str]:
        """The paths one commit changed (against its first parent)."""
        out = self.git("show", "-z", "--name-only", "--format=", commit)
        return {_decode(p) for p in out.split(b"\0") if p.strip()}


def _trailer_values(text: str) -> list[str]:
    """The values of one trailer key as ``%(trailers:...,separator=%x1e)`` prints them."""
    return [v.strip() for v in re.split(r"[\x1e\n]", text) if v.strip()]


class Tree:
    """Files at one state of the repository."""

    label: str

    def files(self) -> list[str]:
        raise NotImplementedError

    def read(self, path: str) -> str | None:
        """Text of a regular file, or ``None`` when absent, a symlink or binary."""
        raise NotImplementedError

    def read_many(self, paths: Iterable[str]) -> dict[str, str | None]:
        return {p: self.read(p) for p in paths}

    def is_symlink(self, path: str) -> bool:
        raise NotImplementedError

    def materialize(self, paths: Sequence[str], dest: Path) -> None:
        """Write the regular files ``paths`` under ``dest`` (for import probes)."""
        for path, text in self.read_many(paths).items():
            if text is None:
                continue
            target = dest / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text, encoding="utf-8", errors="surrogateescape")


def _text(raw: bytes) -> str | None:
    if b"\0" in raw[:8000]:
        return None
    return raw.decode("utf-8", "surrogateescape")


class WorkingTree(Tree):
    """The checkout on disk: tracked files plus untracked, not-ignored ones."""

    def __init__(self, repo: GitRepo) -> None:
        self.repo = repo
        self.root = repo.root
        self.label = "working tree"
        self._files: list[str] | None = None

    def files(self) -> list[str]:
        if self._files is None:
            out = self.repo.git("ls-files", "-z", "--cached", "--others", "--exclude-standard")
            seen = dict.fromkeys(_decode(p) for p in out.split(b"\0") if p)
            self._files = [p for p in seen if os.path.lexists(self.root / p)]
        return self._files

    def is_symlink(self, path: str) -> bool:
        return (self.root / path).is_symlink()

    def read(self, path: str) -> str | None:
        full = self.root / path
        try:
            if not stat.S_ISREG(os.lstat(full).st_mode):
                return None
            return _text(full.read_bytes())
        except OSError:
            return None


class RevisionTree(Tree):
    """The files of one commit, read with ``git ls-tree`` and ``git cat-file``."""

    def __init__(self, repo: GitRepo, rev: str) -> None:
        self.repo = repo
        self.rev = rev
        self.label = rev[:12]
        self._entries: dict[str, tuple[str, str]] | None = None

    def _listing(self) -> dict[str, tuple[str, str]]:
        if self._entries is None:
            out = self.repo.git("ls-tree", "-r", "-z", "--full-tree", self.rev)
            entries: dict[str, tuple[str, str]] = {}
            for record in out.split(b"\0"):
                if not record:
                    continue
                meta, _, path = record.partition(b"\t")
                mode, kind, sha = _decode(meta).split()
                if kind == "blob":
                    entries[_decode(path)] = (mode, sha)
            self._entries = entries
        return self._entries

    def files(self) -> list[str]:
        return list(self._listing())

    def is_symlink(self, path: str) -> bool:
        entry = self._listing().get(path)
        return entry is not None and entry[0] == "120000"

    def read(self, path: str) -> str | None:
        return self.read_many([path])[path]

    def read_many(self, paths: Iterable[str]) -> dict[str, str | None]:
        listing = self._listing()
        wanted = list(dict.fromkeys(paths))
        result: dict[str, str | None] = dict.fromkeys(wanted)
        regular = [p for p in wanted if p in listing and listing[p][0] in ("100644", "100755")]
        if not regular:
            return result
        stdin = "".join(f"{listing[p][1]}\n" for p in regular).encode()
        out = self.repo.git("cat-file", "--batch", stdin=stdin)
        pos = 0
        for p in regular:
            header_end = out.index(b"\n", pos)
            size = int(out[pos:header_end].split()[2])
            body = out[header_end + 1 : header_end + 1 + size]
            pos = header_end + 1 + size + 1
            result[p] = _text(body)
        return result
