"""The checker's one hashing helper (``digests``): parts, files, trees."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import niels_gpt_contracts
from niels_gpt_contracts.digests import Digest, file_digest, tree_digests

SOURCE = Path(niels_gpt_contracts.__file__).resolve().parent
# Hashes of no file or tree: the schema cache's key, a SARIF result's fingerprint.
NOT_TREES = {"digests.py", "stagespec/schema.py", "reporters/sarif.py"}


def test_parts_are_ended_so_they_cannot_run_together() -> None:
    assert Digest("ab", "c").hexdigest() != Digest("a", "bc").hexdigest()
    assert Digest("a", b"b").hexdigest() == hashlib.sha256(b"a\0b\0").hexdigest()
    assert Digest("\udcff").digest() == hashlib.sha256(b"\xff\0").digest()  # surrogateescape
    assert Digest().raw(b"x").add("y").hexdigest() == hashlib.sha256(b"xy\0").hexdigest()


def test_a_file_and_a_tree_hash_their_bytes(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "a").write_bytes(b"one")
    (tmp_path / "sub" / "b.pyc").write_bytes(b"\x00two")
    assert file_digest(tmp_path / "a") == hashlib.sha256(b"one").hexdigest()
    assert tree_digests(tmp_path) == {
        "a": hashlib.sha256(b"one").hexdigest(),
        "sub/b.pyc": hashlib.sha256(b"\x00two").hexdigest(),
    }


def test_no_other_module_of_the_checker_hashes_for_itself() -> None:
    """Trees, files and keys go through ``digests``; the sandbox's worker scripts
    (``_*.py``), which run apart from the checker, keep their own."""
    found = [
        str(p.relative_to(SOURCE))
        for p in sorted(SOURCE.rglob("*.py"))
        if not p.name.startswith("_")
        and str(p.relative_to(SOURCE)) not in NOT_TREES
        and re.search(r"^import hashlib|hashlib\.", p.read_text(encoding="utf-8"), re.M)
    ]
    assert found == []
