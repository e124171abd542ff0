"""The checker's one way to hash: SHA-256 over NUL-ended parts, over a file, over a tree.

``Digest`` hashes parts each followed by a NUL byte (text as UTF-8, undecodable
bytes kept by ``surrogateescape``), so no two part lists hash alike by
running together; ``raw`` adds bytes as they are. ``file_digest`` streams
one file; ``tree_digests`` maps every file under a folder to its digest.
Used by the stage fingerprint (``fingerprint``), the mutant proof keys
(``mutants.proof``), the sandbox environment's key and manifest
(``sandbox.environment``, ``sandbox.env_trust``) and the checker's
self-check (``verdict.integrity``). Nothing here imports from the checker.
"""

from __future__ import annotations

import hashlib
from pathlib import Path


class Digest:
    """A running SHA-256 over NUL-ended parts (``add``) and plain bytes (``raw``)."""

    def __init__(self, *parts: str | bytes) -> None:
        self._hash = hashlib.sha256()
        self.add(*parts)

    def add(self, *parts: str | bytes) -> Digest:
        """Each part, then a NUL byte; text as UTF-8 (``surrogateescape``)."""
        for part in parts:
            data = part.encode("utf-8", "surrogateescape") if isinstance(part, str) else part
            self._hash.update(data + b"\0")
        return self

    def raw(self, data: bytes) -> Digest:
        """``data`` as it is, no separator."""
        self._hash.update(data)
        return self

    def digest(self) -> bytes:
        return self._hash.digest()

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def file_digest(path: Path) -> str:
    """The hex SHA-256 of ``path``'s bytes, read in blocks.

    Raises:
        OSError: ``path`` cannot be read.
    """
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def tree_digests(root: Path) -> dict[str, str]:
    """``relative path -> hex SHA-256`` of every file under ``root`` (caches included:
    a planted bytecode file would run instead of its source), in path order."""
    return {
        str(p.relative_to(root)): file_digest(p) for p in sorted(root.rglob("*")) if p.is_file()
    }
