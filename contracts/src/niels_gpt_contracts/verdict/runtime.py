"""Judge runtime rules from what their drivers dispatched (``runtime.<rule id>``).

A rule of kind ``forbidden_ops`` is broken on a device when an op matching
one of its ``ops`` patterns was dispatched inside a ``record()`` block, or,
with ``casts = true``, when a copy there changed dtype or device. It is also
broken, fail closed, when its driver raised, recorded nothing, or the probe
itself failed: a rule nobody could check is not a rule that holds.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.sandbox.runtime_probe import ProbeRun, rule_key
from niels_gpt_contracts.stagespec import Rule, Spec


def judge(rules: Sequence[tuple[Spec, Rule]], probe: ProbeRun, stage: str) -> list[Violation]:
    """Violations of every rule on ``probe.device``; reported under ``stage``."""
    check = f"runtime:{probe.device}"
    out: list[Violation] = []

    def add(spec: Spec, rule: Rule, message: str) -> None:
        out.append(
            Violation(
                rule.rule_id,
                spec.path,
                rule.line,
                f"{message} on {probe.device} [{rule.message}]",
                stage,
                check,
            )
        )

    for spec, rule in rules:
        driver = rule.params["driver"]
        if probe.problem is not None:
            add(spec, rule, f"not checked: {probe.problem}")
            continue
        got = probe.recorded.get(rule_key(rule))
        if got is None:
            add(spec, rule, "not checked: the probe returned nothing for this rule")
        elif got.error is not None:
            add(spec, rule, f"the driver {driver} raised: {got.error}")
        elif got.blocks == 0:
            add(spec, rule, f"the driver {driver} recorded nothing (no 'with record():' block ran)")
        else:
            patterns = list(rule.params["ops"])
            hits = sorted(o for o in got.ops if any(fnmatch.fnmatchcase(o, p) for p in patterns))
            if hits:
                add(spec, rule, f"dispatched {', '.join(hits)} while {driver} ran")
            if rule.params.get("casts") and got.casts:
                add(
                    spec,
                    rule,
                    f"changed dtype or device while {driver} ran: {'; '.join(got.casts)}",
                )
    return out
