"""Run the runtime-rule drivers of some stages in the sandbox; read what they dispatched."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from niels_gpt_contracts import specpath
from niels_gpt_contracts.sandbox import processes
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.stagespec import Rule

PROBE = Path(__file__).with_name("_runtime_probe.py")


def rule_key(rule: Rule) -> str:
    """A rule's key in the probe's answer: several stages may use one rule id."""
    return f"{rule.params['driver']}#{rule.id}"


@dataclass(frozen=True)
class Recorded:
    """What one rule's driver dispatched inside its ``record()`` blocks."""

    ops: tuple[str, ...] = ()
    casts: tuple[str, ...] = ()
    blocks: int = 0
    error: str | None = None


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
    lines = done.stdout.strip().splitlines()
    try:
        data = json.loads(lines[-1]) if done.code == 0 and lines else None
        if not isinstance(data, dict):
            raise ValueError("no result line")
        for rule in rules:
            got = data[rule_key(rule)]
            out.recorded[rule_key(rule)] = Recorded(
                tuple(map(str, got["ops"])),
                tuple(map(str, got["casts"])),
                int(got["blocks"]),
                None if got["error"] is None else str(got["error"]),
            )
    except (ValueError, KeyError, TypeError) as err:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        out.problem = f"the runtime probe failed (exit {done.code}, {err}): {tail}"
    return out
