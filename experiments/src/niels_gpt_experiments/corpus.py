"""Byte corpora on disk, read back as memory-mapped token arrays.

The default corpus is the Python standard library's own ``.py`` sources, which
every Python installation carries, so nothing is downloaded. Any folder or
single text file of the user's can stand in for it.

A corpus is written once into a cache directory as two flat ``uint8`` files,
``train.bin`` and ``val.bin`` (one byte = one token, V=256), plus
``meta.json``; training reads them through ``numpy.memmap``, so a corpus larger
than memory works. Files are streamed in, never held whole.

Split, for a folder (the standard library included): by file, so no file
straddles the two halves. A file goes to validation when the first 8 bytes of
``sha256(relative POSIX path)``, as an integer, mod 1000 are below
``val_permille``; the split is therefore stable when files are added. Should no
file land in validation, the file with the smallest hash does. Every file is
followed by one NUL byte (``0x00``), the document separator. A single file is
split by position instead: its last ``val_permille`` thousandths validate.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
import sysconfig
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FORMAT",
    "SEPARATOR",
    "Corpus",
    "CorpusError",
    "CorpusSpec",
    "is_validation",
    "list_sources",
    "open_corpus",
]

FORMAT = 1
SEPARATOR = 0  # byte written after every file of a folder corpus
_SKIP_DIRS = frozenset(
    {"site-packages", "dist-packages", "__pycache__", "test", "tests", "idle_test"}
)
_BINARY_PROBE = 8192


class CorpusError(ValueError):
    """A corpus that cannot be built or read (missing path, empty split, too short)."""


@dataclass(frozen=True)
class CorpusSpec:
    """Which text to train on.

    Attributes:
        path: a folder or a single text file; ``None`` is the standard library.
        include: glob patterns (``Path.match``) a folder's files must match.
        val_permille: thousandths of the corpus held out for validation, in ``[1, 999]``.
    """

    path: Path | None = None
    include: tuple[str, ...] = ("*.py",)
    val_permille: int = 50

    def __post_init__(self) -> None:
        if isinstance(self.val_permille, bool) or not isinstance(self.val_permille, int):
            raise CorpusError(f"val_permille must be an int, got {self.val_permille!r}")
        if not 1 <= self.val_permille <= 999:
            raise CorpusError(f"val_permille must be in [1, 999], got {self.val_permille}")
        if not self.include:
            raise CorpusError("include must name at least one glob pattern, got none")


@dataclass(frozen=True)
class Corpus:
    """The two token arrays of a built corpus and what was recorded about it."""

    train: np.memmap[Any, np.dtype[np.uint8]]
    val: np.memmap[Any, np.dtype[np.uint8]]
    meta: dict[str, Any]
    directory: Path


def stdlib_root() -> Path:
    """Folder of the running interpreter's standard library (the base one inside a venv)."""
    return Path(sysconfig.get_paths()["stdlib"]).resolve()


def _python() -> str:
    return f"{platform.python_implementation()} {platform.python_version()}"


def _looks_binary(path: Path) -> bool:
    with path.open("rb") as handle:
        return b"\x00" in handle.read(_BINARY_PROBE)


def list_sources(spec: CorpusSpec) -> tuple[Path, list[str]]:
    """The corpus root and its files as sorted relative POSIX paths.

    The standard library skips ``site-packages`` and its test suites (``test``,
    ``tests``, ``idle_test``); a user folder skips hidden entries and files
    that look binary (a NUL byte in the first 8 KiB). A single file yields
    ``(file, [])``.

    Raises:
        CorpusError: the path does not exist, or a folder has no matching file.
    """
    include: tuple[str, ...] = ("*.py",)
    if spec.path is None:
        root, skip = stdlib_root(), _SKIP_DIRS
    else:
        root = spec.path.expanduser().resolve()
        if not root.exists():
            raise CorpusError(f"corpus path {str(spec.path)!r} does not exist")
        if root.is_file():
            return root, []
        skip, include = frozenset(), spec.include
    files = []
    for folder, dirs, names in os.walk(root):
        # Prune in place, so skipped trees (site-packages, tests) are never walked.
        dirs[:] = sorted(d for d in dirs if not d.startswith(".") and d not in skip)
        for name in names:
            path = Path(folder, name)
            rel = path.relative_to(root)
            if name.startswith(".") or not any(rel.match(p) for p in include):
                continue
            if path.is_file() and not (spec.path is not None and _looks_binary(path)):
                files.append(rel.as_posix())
    if not files:
        raise CorpusError(f"no file under {str(root)!r} matches {list(include)}")
    return root, sorted(files)


def file_hash(rel: str) -> int:
    """First 8 bytes of ``sha256(rel)`` as an unsigned integer."""
    return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "big")


def is_validation(rel: str, val_permille: int) -> bool:
    """Whether the file at relative POSIX path ``rel`` belongs to the validation split."""
    return file_hash(rel) % 1000 < val_permille


def split_files(files: Sequence[str], val_permille: int) -> tuple[list[str], list[str]]:
    """``(train, val)`` by path hash; at least one file validates when there are two or more."""
    val = [f for f in files if is_validation(f, val_permille)]
    if not val and len(files) > 1:
        val = [min(files, key=file_hash)]
    chosen = set(val)
    return [f for f in files if f not in chosen], val


def _key(spec: CorpusSpec, root: Path, files: Sequence[str]) -> str:
    """Cache key: everything that decides the bytes of the two arrays."""
    digest = hashlib.sha256(json.dumps([FORMAT, _python(), str(root), spec.val_permille]).encode())
    for rel in files or [""]:
        stat = (root / rel).stat() if rel else root.stat()
        digest.update(f"{rel}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    name = "stdlib" if spec.path is None else "user"
    return f"{name}-{digest.hexdigest()[:16]}"


def _stream(paths: Iterable[Path], out: Path, separator: bool) -> tuple[int, str]:
    digest = hashlib.sha256()
    size = 0
    with out.open("wb") as sink:
        for path in paths:
            with path.open("rb") as source:
                while chunk := source.read(1 << 20):
                    sink.write(chunk)
                    digest.update(chunk)
                    size += len(chunk)
            if separator:
                sink.write(bytes([SEPARATOR]))
                digest.update(bytes([SEPARATOR]))
                size += 1
    return size, digest.hexdigest()


def _split_single_file(path: Path, val_permille: int, train: Path, val: Path) -> dict[str, Any]:
    total = path.stat().st_size
    cut = total - (total * val_permille) // 1000
    sizes, digests = {}, {}
    with path.open("rb") as source:
        for name, out, length in (("train", train, cut), ("val", val, total - cut)):
            digest = hashlib.sha256()
            with out.open("wb") as sink:
                left = length
                while left > 0 and (chunk := source.read(min(left, 1 << 20))):
                    sink.write(chunk)
                    digest.update(chunk)
                    left -= len(chunk)
            sizes[name], digests[name] = length, digest.hexdigest()
    return {
        "split": f"by position: the last {val_permille}/1000 of the file",
        "bytes": sizes,
        "sha256": digests,
        "files": {"train": 1, "val": 1},
    }


def _build(spec: CorpusSpec, root: Path, files: list[str], target: Path) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix=target.name + ".tmp-", dir=target.parent))
    try:
        if files:
            train, val = split_files(files, spec.val_permille)
            t_size, t_sha = _stream((root / f for f in train), work / "train.bin", separator=True)
            v_size, v_sha = _stream((root / f for f in val), work / "val.bin", separator=True)
            info: dict[str, Any] = {
                "split": f"by file: sha256(relative path)[:8] mod 1000 < {spec.val_permille}",
                "bytes": {"train": t_size, "val": v_size},
                "sha256": {"train": t_sha, "val": v_sha},
                "files": {"train": len(train), "val": len(val)},
                "val_files": val,
            }
        else:
            info = _split_single_file(root, spec.val_permille, work / "train.bin", work / "val.bin")
        meta = {
            "format": FORMAT,
            "source": "python-stdlib" if spec.path is None else "user",
            "root": str(root),
            "python": _python(),
            "val_permille": spec.val_permille,
            "separator": SEPARATOR if files else None,
            **info,
        }
        (work / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
        try:
            work.rename(target)  # atomic: readers see a whole corpus or none
        except OSError:
            if not (target / "meta.json").is_file():
                raise
    finally:
        if work.exists():
            shutil.rmtree(work)
    return meta


def default_data_dir() -> Path:
    """``$NIELS_GPT_DATA``, else ``~/.cache/niels-gpt-experiments``."""
    env = os.environ.get("NIELS_GPT_DATA")
    return Path(env) if env else Path.home() / ".cache" / "niels-gpt-experiments"


def open_corpus(spec: CorpusSpec, data_dir: Path | None = None) -> Corpus:
    """Build the corpus into ``data_dir`` unless it is there already, then map it.

    Raises:
        CorpusError: see ``list_sources``; or a split came out empty.
    """
    root, files = list_sources(spec)
    cache = (data_dir or default_data_dir()).expanduser()
    cache.mkdir(parents=True, exist_ok=True)
    target = cache / _key(spec, root, files)
    if (target / "meta.json").is_file():
        meta = json.loads((target / "meta.json").read_text())
    else:
        meta = _build(spec, root, files, target)
    arrays = {}
    for name in ("train", "val"):
        if meta["bytes"][name] == 0:
            raise CorpusError(f"the {name} split of {str(root)!r} is empty")
        arrays[name] = np.memmap(target / f"{name}.bin", dtype=np.uint8, mode="r")
    return Corpus(train=arrays["train"], val=arrays["val"], meta=meta, directory=target)
