"""``forbidden_ops`` (runtime): no ATen op matching ``ops`` (and, with ``casts``,
no dtype or device change) is dispatched inside the ``with record():`` blocks
of the rule's ``driver``, a maintainer-owned ``fn(device, record)`` in
``specs/<stage>/``. ``contracts pr`` runs the driver (``verdict.runtime``);
nothing here reads code."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from niels_gpt_contracts.rules.spec_rules import Problem, RuleKind


def problems(params: Mapping[str, Any], stage: str) -> list[Problem]:
    """A driver outside ``specs/<stage>/`` is not the stage's maintainers' own."""
    driver: str = params["driver"]
    if not driver.startswith(f"specs/{stage}/"):
        return [
            (
                "driver",
                f"expected a driver under specs/{stage}/ (maintainer-owned), found {driver!r}",
            )
        ]
    return []


KIND = RuleKind(
    "forbidden_ops",
    "no listed ATen op (or, where the rule says so, no dtype or device "
    "change) is dispatched while the rule's driver runs the stage's code",
    {
        "driver": {
            "type": "string",
            "pattern": "^specs/[a-z][a-z0-9_]*/[A-Za-z_][A-Za-z0-9_]*\\.py:[A-Za-z_][A-Za-z0-9_]*$",
            "description": "A maintainer-owned function `fn(device, record)` in "
            "specs/<this stage>/ that runs the stage's code; the ATen ops dispatched inside "
            "its `with record():` blocks are judged (runtime rule, checked by `contracts pr`).",
        },
        "ops": {
            "type": "array",
            "items": {"type": "string", "pattern": "^[a-z_]+::"},
            "description": "fnmatch patterns over ATen op names (e.g. "
            "`aten::_scaled_dot_product_*`) that must never be dispatched there.",
        },
        "casts": {
            "type": "boolean",
            "description": "Also fail on any dtype or device change there: aten::_to_copy, "
            "or aten::copy_ between tensors of different dtype or device.",
        },
        "tests": {
            "type": "boolean",
            "description": "Also judge the stage's reference tests (contracts pr): an op "
            "matching `ops` that the PR's code dispatches during one of them, and the base's "
            "code does not, breaks the rule.",
        },
    },
    ("driver", "ops"),
    None,
    problems,
)
