"""Which test killed each mutant before: the test its next run tries first.

A hint never counts as proof. It only orders the work: the hinted test runs
alone on the mutant, and that run is a kill only when the same test passed
alone on the clean code in the same configuration (``schedule``). A hint that
is wrong, stale or missing costs one run, never a verdict.

Hints come from the kill store (the test that killed a mutant in an earlier
run on this machine) and from ``specs/mutant-hints.json``, which maintainers
commit so that a fresh clone or a CI runner starts with them too:

    {"about": "...", "hints": {"<stage>.<mutant id>": "<test node id>", ...}}

``contracts mutants --write-hints`` rewrites that file from a run's kills.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

HINTS_PATH = "specs/mutant-hints.json"
ABOUT = (
    "Which test killed each mutant, written by `contracts mutants --write-hints`. A hint only "
    "orders the runs: the named test runs first, alone, and a kill still needs it to pass on "
    "the clean code and fail on the mutant. A stale hint costs one run, never a verdict."
)
_PREFIXES = ("failed: ", "error: ")


def parse(text: str | None) -> dict[str, str]:
    """The hints in a ``mutant-hints.json`` text; nothing for anything malformed."""
    if not text:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        return {}
    hints = data.get("hints") if isinstance(data, dict) else None
    if not isinstance(hints, dict):
        return {}
    return {str(k): v for k, v in hints.items() if isinstance(v, str) and "::" in v}


def render(hints: Mapping[str, str]) -> str:
    """The file's text: one hint a line, sorted, so merges stay line by line."""
    body = ",\n".join(f"    {json.dumps(k)}: {json.dumps(v)}" for k, v in sorted(hints.items()))
    return f'{{\n  "about": {json.dumps(ABOUT)},\n  "hints": {{\n{body}\n  }}\n}}\n'


def killing_test(reason: str) -> str | None:
    """The node id in a kill's reason (``failed: <id>``), or None (collection errors)."""
    for prefix in _PREFIXES:
        if reason.startswith(prefix) and "::" in reason:
            return reason[len(prefix) :].strip()
    return None
