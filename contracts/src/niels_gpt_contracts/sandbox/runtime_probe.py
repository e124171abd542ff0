"""Run the runtime-rule drivers of some stages in the sandbox; read what they dispatched."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from niels_gpt_contracts import specpath
from niels_gpt_contracts.decoding import Malformed, decode, last_line, one_line
from niels_gpt_contracts.sandbox import processes
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.stagespec import Rule

PROBE = Path(__file__).with_name("_runtime_probe.py")


def rule_key(rule: Rule) -> str:
    """A rule's key in the probe's answer: several stages may use one rule id."""
    return f"{rule.params['driver']}#{rule.id}"


class Recorded(msgspec.Struct, frozen=True):
    """What one rule's driver dispatched inside its ``record()`` blocks (the probe's
    answer for one rule, ``_runtime_probe._probe``: every field is required there)."""

    ops: tuple[str, ...]
    casts: tuple[str, ...]
    blocks: int
    error: str | None


@dataclass
class ProbeRun:
    device: str
    recorded: dict[str, Recorded] = field(default_factory=dict)
    problem: str | None = None


def run(
    box: Sandbox,
    rules: Sequence[Rule],
    *,
    device: str,
    drivers_root: Path,
    roots: Sequence[Path],
    timeout: float = 600.0,
) -> ProbeRun:
    """One probe process for ``rules`` on ``device``; drivers are read under ``drivers_root``."""
    out = ProbeRun(device)
    if not rules:
        return out
    stages = sorted({str(r.params["driver"]).split("/")[1] for r in rules})
    request = {
        "device": device,
        "root": str(drivers_root),
        "paths": specpath.driver_path(drivers_root, stages),
        "rules": [{"id": rule_key(r), "driver": r.params["driver"]} for r in rules],
    }
    done = processes.run(
        [box.python, str(PROBE)],
        env=box.environ(roots),
        cwd=box.home,
        timeout=timeout,
        stdin=json.dumps(request),
    )
    if done.timed_out:
        out.problem = f"the runtime probe timed out after {timeout:g} s"
        return out
    out.recorded, out.problem = read_answer(done.code, done.stdout, done.stderr, rules)
    return out


def read_answer(
    code: int | None, stdout: str, stderr: str, rules: Sequence[Rule]
) -> tuple[dict[str, Recorded], str | None]:
    """The probe's answer for ``rules`` (by ``rule_key``), or ``({}, problem)``: a
    non-zero exit, no answer, one of another shape, or a rule left unanswered."""
    try:
        if code != 0:
            raise Malformed("no answer")
        data = decode(last_line(stdout), dict[str, Recorded], "expected a record per rule")
        missing = [rule_key(r) for r in rules if rule_key(r) not in data]
        if missing:
            raise Malformed(one_line(f"expected a record for {missing[0]}, found none"))
    except Malformed as err:
        tail = one_line(last_line(stderr) or "no output")
        return {}, f"the runtime probe failed (exit {code}, {err}): {tail}"
    return {rule_key(r): data[rule_key(r)] for r in rules}, None
