"""A device report kept stage by stage, so that a narrowed run adds to it.

Besides what every report holds (see the pytest plugin), a report written
with ``--invariant-report-merge`` has::

    "sections": {"rope": {"key": "<the stage's fingerprint key>",
                          "collected": ["packages/rope/tests/...::test_x", ...],
                          "complete": true, "exitstatus": 0}},

and each entry of ``"tests"`` gains ``"key"``, the key of its stage when it
ran. A section lists every test of its stage that the run collected, those
a ``-k``/``-m``/``--deselect`` left out included (collection sees them all);
``complete`` says the run's paths covered all of the stage's test folders,
so no test of the stage can be missing from the list. ``merge`` lays a run
over the previous report: each stage the run collected gets the run's
section, its tests' outcomes replace the old ones, and a stage it did not
touch keeps its old section and outcomes. The gate then judges each stage on
its own section (``checks.evidence.staleness``): fresh when the key is the tree's and
every collected test has an outcome under that key.

Imports nothing from the checker: the plugin and the gate both use it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from niels_gpt_contracts.fingerprint import owner

__all__ = ["FORMAT", "count_invariants", "merge", "sections"]

FORMAT = 2
_OUTCOMES = ("passed", "failed", "skipped")


def sections(
    collected: Iterable[str], keys: Mapping[str, str], complete: set[str], exitstatus: int
) -> dict[str, dict[str, Any]]:
    """One section per stage that owns a collected test.

    Args:
        collected: every test id the run collected (deselected ones included).
        keys: each stage's key (``fingerprint.tree(root).stages``).
        complete: the stages whose test folders the run's paths covered whole.
    """
    by_stage: dict[str, list[str]] = defaultdict(list)
    for nodeid in collected:
        stage = owner(nodeid)
        if stage is not None:
            by_stage[stage].append(nodeid)
    return {
        stage: {
            "key": keys.get(stage, ""),
            "collected": sorted(ids),
            "complete": stage in complete,
            "exitstatus": exitstatus,
        }
        for stage, ids in sorted(by_stage.items())
    }


def count_invariants(tests: Mapping[str, Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-invariant counts and test ids, from one outcome per test."""
    counts: dict[str, dict[str, Any]] = {}
    for nodeid, entry in sorted(tests.items()):
        outcome = entry.get("outcome")
        for inv in entry.get("invariants", []):
            row = counts.setdefault(
                str(inv), {**dict.fromkeys(_OUTCOMES, 0), "tests": [], "failed_tests": []}
            )
            if outcome in _OUTCOMES:
                row[outcome] += 1
            row["tests"].append(nodeid)
            if outcome == "failed":
                row["failed_tests"].append(nodeid)
    return dict(sorted(counts.items()))


def _usable(old: Any, device: str) -> bool:
    return (
        isinstance(old, dict)
        and old.get("format") == FORMAT
        and old.get("device") == device
        and isinstance(old.get("sections"), dict)
        and isinstance(old.get("tests"), dict)
    )


def merge(old: Any, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` (this run's report, with ``sections``) laid over ``old`` (the file's).

    An ``old`` of another format or device is not merged: ``new`` stands alone.
    A section the run collected only in part (``complete`` false) is joined
    with the old one when both have the same key; otherwise it replaces it.
    A complete section drops the old outcomes of tests it no longer collects.
    """
    if not _usable(old, new["device"]):
        return {**new, "invariants": count_invariants(new["tests"])}
    merged_sections = dict(old["sections"])
    tests = dict(old["tests"])
    for stage, section in new["sections"].items():
        before = merged_sections.get(stage)
        same_tree = isinstance(before, dict) and before.get("key") == section["key"]
        if not section["complete"] and same_tree:
            assert isinstance(before, dict)
            ids = sorted(set(before.get("collected", [])) | set(section["collected"]))
            section = {**section, "collected": ids, "complete": bool(before.get("complete"))}
        if section["complete"]:
            keep = set(section["collected"])
            tests = {t: e for t, e in tests.items() if owner(t) != stage or t in keep}
        merged_sections[stage] = section
    tests.update(new["tests"])
    return {
        **new,
        "sections": dict(sorted(merged_sections.items())),
        "tests": dict(sorted(tests.items())),
        "invariants": count_invariants(tests),
    }
