"""Whether a per-stage device report speaks for the tree being judged, stage by stage.

A report written by the plugin since format 2 has one section per stage
(``niels_gpt_contracts.device_report``). A stage's device row rests on the
outcomes of the tests that claim its invariants, and each of those tests
belongs to a stage (its folder). Each such stage's section must be fresh:
its key equal to the tree's key for that stage (its code, its tests and the
stages it depends on, ``fingerprint``), its list of tests complete, and every
test in it run under that key. An edit to a leaf stage leaves the other
stages' sections fresh; a narrowed run that reran only the edited stage
makes its section fresh again.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from niels_gpt_contracts.fingerprint import owner
from niels_gpt_contracts.rules import Rule

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
DEVICE_STALE = Rule(
    "device.stale",
    "A device report was produced from another tree than the one judged.",
    "Every invariant report records the fingerprint of the stage sources and tests it "
    "ran on; a report whose fingerprint differs from the tree being judged proves "
    "nothing about it, so the device counts as not run (broken when required).",
    "Run the device session again on this tree: nox -s test-<device>.",
)

DEVICE_PARTIAL = Rule(
    "device.partial",
    "A device report covers a narrowed test selection.",
    "A run narrowed with -k, -m, --deselect, node ids, -x or --last-failed (or an old "
    "report that does not say what it covered) may have left out a failing test, so "
    "it counts as not run (broken when required).",
    "Run the whole device session without narrowing options.",
)

__all__ = ["fresh_failures", "stale_section"]


def _rerun(device: str, stage: str) -> str:
    return f"rerun them (nox -s test-{device} -- -k {stage} adds to the report)"


def stale_section(
    device: str,
    path: str,
    sections: Mapping[str, Mapping[str, Any]],
    tests: Mapping[str, Mapping[str, Any]],
    invariant_ids: set[str],
    stage: str,
    keys: Mapping[str, str],
) -> tuple[str, str] | None:
    """``(rule, why)`` for the first stage whose section cannot speak for ``stage``'s row.

    ``sections`` and ``tests`` are the report's; ``keys`` the tree's stage keys.
    ``None`` when every section the row depends on is fresh.
    """
    involved = {stage} | {
        o
        for nodeid, entry in tests.items()
        if invariant_ids & set(entry.get("invariants", [])) and (o := owner(nodeid))
    }
    for name in sorted(involved, key=lambda s: (s != stage, s)):
        section = sections.get(name)
        if name not in keys or (section is None and name == stage):
            continue  # a stage gone from the tree, or one no test ran for: counts decide
        if section is None:
            return DEVICE_STALE.id, (
                f"the {device} report ({path}) has outcomes of {name}'s tests but no record "
                f"of the tree they ran on: {_rerun(device, name)}"
            )
        key = str(section.get("key", ""))
        if key != keys[name]:
            return DEVICE_STALE.id, (
                f"the {device} report's tests of {name} ({path}) ran on another tree "
                f"(key {key[:12] or 'unknown'}, the tree judged has {keys[name][:12]}): "
                f"{_rerun(device, name)}"
            )
        if not section.get("complete"):
            return DEVICE_PARTIAL.id, (
                f"the {device} report ({path}) holds {name}'s tests only in part (the run "
                f"that wrote them was given part of their folders): {_rerun(device, name)}"
            )
        collected = [str(t) for t in section.get("collected", [])]
        missing = [t for t in collected if tests.get(t, {}).get("key") != keys[name]]
        if missing:
            return DEVICE_PARTIAL.id, (
                f"{len(missing)} of {name}'s {len(collected)} tests have no outcome on this "
                f"tree in the {device} report ({path}; first: {missing[0]}): "
                f"{_rerun(device, name)}"
            )
    return None


def fresh_failures(
    tests: Mapping[str, Mapping[str, Any]], invariant_ids: set[str], keys: Mapping[str, str]
) -> dict[str, list[str]]:
    """Invariant -> the tests claiming it that failed under their stage's current key.

    Such a failure is evidence about the tree being judged even when the rest
    of the report is stale or partial.
    """
    found: dict[str, list[str]] = {}
    for nodeid, entry in sorted(tests.items()):
        stage = owner(nodeid)
        if entry.get("outcome") != "failed" or stage is None or stage not in keys:
            continue
        if entry.get("key") != keys[stage]:
            continue
        for inv in sorted(invariant_ids & set(entry.get("invariants", []))):
            found.setdefault(inv, []).append(nodeid)
    return found
