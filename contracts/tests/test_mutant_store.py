"""The store of proven kills: read by type, believed only when well formed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from niels_gpt_contracts.mutants.store import STORE_VERSION, Cache

GOOD = {"key": "k1", "reason": "test_x failed", "test": "tests/test_a.py::test_x"}


def _cache(tmp_path: Path, payload: object) -> Cache:
    path = tmp_path / ".mutants-cache.json"
    path.write_text(json.dumps(payload) if not isinstance(payload, str) else payload)
    return Cache(path, enabled=True)


def test_a_well_formed_store_is_believed_under_its_key(tmp_path: Path) -> None:
    cache = _cache(tmp_path, {"version": STORE_VERSION, "kills": {"m": GOOD, "n": {"key": "k"}}})
    assert cache.kill("m", "k1") == "test_x failed" and cache.kill("m", "k2") is None
    assert cache.hint("m") == "tests/test_a.py::test_x" and cache.hint("n") is None
    assert cache.kill("n", "k") == ""


@pytest.mark.parametrize(
    "payload",
    [
        {"version": STORE_VERSION, "kills": {"m": GOOD, "bad": {"key": 7}}},
        {"version": STORE_VERSION, "kills": {"m": GOOD, "bad": "killed"}},
        {"version": STORE_VERSION, "kills": [GOOD]},
        {"version": STORE_VERSION - 1, "kills": {"m": GOOD}},
        {"kills": {"m": GOOD}},
        "{not json",
    ],
    ids=["key", "entry", "kills", "version", "no-version", "json"],
)
def test_a_store_of_the_wrong_shape_proves_nothing(tmp_path: Path, payload: object) -> None:
    """Nothing of a malformed store is believed: every kill is proven again."""
    cache = _cache(tmp_path, payload)
    assert cache.entries == {} and cache.kill("m", "k1") is None
