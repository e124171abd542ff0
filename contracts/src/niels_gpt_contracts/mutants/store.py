"""Proven kills, kept between runs: ``{"version", "kills": {name: entry}}`` in one JSON file.

An entry is ``{"key", "reason", "test"}``: the proof key the kill was proven
under (``proof``), why it died, and the test that killed it (a hint for the
next run, whatever its key). A kill is believed only under the same key.

The store is read once, when made (the PR verdict makes it before any of the
PR's code runs, so nothing that code writes is believed). ``record`` writes
under a file lock: it re-reads the file, lays this run's kills over it
(another run sharing the cache may have written since), drops the entries
this run found not killed under the same key, and renames a private
temporary file into place, so concurrent runs never see half a file nor lose
each other's kills.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
from filelock import FileLock

from niels_gpt_contracts.decoding import Malformed, decode
from niels_gpt_contracts.mutants.hints import killing_test

if TYPE_CHECKING:
    from niels_gpt_contracts.mutants.fates import Fate

STORE_VERSION = 2


class Cache:
    def __init__(self, path: Path, enabled: bool) -> None:
        self.path = path
        self.enabled = enabled
        self.entries = _read(path)

    def kill(self, name: str, key: str) -> str | None:
        """The reason of a kill proven under ``key``, or None."""
        entry = self.entries.get(name)
        if self.enabled and entry and entry.get("key") == key:
            return entry.get("reason", "")
        return None

    def hint(self, name: str) -> str | None:
        """The test that killed ``name`` last, under any key."""
        test = self.entries.get(name, {}).get("test")
        return test or None

    def record(self, fates: Sequence[Fate], keys: Mapping[str, str]) -> None:
        new = {v.mutant.name: v for v in fates if not v.cached and v.mutant.name in keys}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(self.path.with_name(self.path.name + ".lock")):
            entries = _read(self.path)
            for name, v in new.items():
                if v.status == "killed":
                    entry = {"key": keys[name], "reason": v.reason}
                    test = killing_test(v.reason) or entries.get(name, {}).get("test")
                    entries[name] = {**entry, "test": test} if test else entry
                elif entries.get(name, {}).get("key") == keys[name]:
                    entries.pop(name)
            payload = {"version": STORE_VERSION, "kills": dict(sorted(entries.items()))}
            fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(json.dumps(payload, indent=1) + "\n")
            os.replace(tmp, self.path)
        self.entries = entries


class Kill(msgspec.Struct, omit_defaults=True):
    """One proven kill as stored: its proof key, why it died, the test that killed it."""

    key: str
    reason: str = ""
    test: str | None = None


class _Store(msgspec.Struct):
    version: int
    kills: dict[str, Kill] = {}


def _read(path: Path) -> dict[str, dict[str, str]]:
    """The kills stored at ``path``; none where the file is missing, of another
    version, or not a store (decoded by type): its kills are then proven again."""
    try:
        store = decode(path.read_bytes(), _Store, str(path))
    except (OSError, Malformed):
        return {}
    if store.version != STORE_VERSION:
        return {}
    return {name: msgspec.to_builtins(kill) for name, kill in store.kills.items()}
