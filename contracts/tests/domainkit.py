"""Run one stage's ``domain/...`` oracle calls on this checkout's code, as is and broken.

A stage's domain sweeps (``specs/<stage>/<stage>_oracle_domain.py``) must
answer every call on the honest code, and must tell a deliberately broken
copy of the stage from it. ``answers`` starts the workers ``verdict.oracle``
starts, from this checkout's tree, like ``refkit`` (whose pattern this
follows): one on the real code, one on a copy with ``edits`` applied, same
seed; ``judged`` compares them with the verdict's own ``Judge``.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import refkit

from niels_gpt_contracts import specpath
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.oracle_run import Job, Stream
from niels_gpt_contracts.verdict.oracle_compare import Judge

DOMAIN = ("domain/*",)


def answers(
    stage: str,
    seed: int,
    scratch: Path,
    *,
    edits: Mapping[str, refkit.Edit] | None = None,
    only: Sequence[str] = DOMAIN,
    timeout: float = 900.0,
) -> tuple[Stream, Stream]:
    """``stage``'s calls matching ``only``: (on the real code, on the code with ``edits``).

    Without ``edits`` the second stream is empty (one worker only).
    """
    all_specs = refkit.specs()
    spec = all_specs[stage]
    assert spec.oracle is not None
    names = sorted({m.split(".")[0] for m in refkit._preload(all_specs)})
    entry = {
        "stage": stage,
        "file": str(refkit.REPO / spec.oracle.driver_file),
        "function": spec.oracle.function,
        "watch": {},
        "only": list(only),
    }
    request = {
        "seed": seed,
        "names": names,
        "drivers": [entry],
        "references": {},
        "preload": refkit._preload(all_specs),
        "paths": specpath.driver_path(refkit.REPO, [stage]),
    }
    box = Sandbox.prepare(sys.executable, scratch / "box", names, threads=1)
    jobs = [(Job("main", refkit._code(scratch / "main", {}), request, threads=1), True)]
    if edits:
        broken = refkit._code(scratch / "broken", edits)
        jobs.append((Job("broken", broken, request, threads=1), False))
    streams = refkit.run(box, jobs, timeout)
    return streams[0], streams[1] if edits else Stream("broken")


def healthy(stage: str, stream: Stream) -> list[str]:
    """What went wrong running the driver (empty when every call ran to an answer)."""
    wrong = [p for p in (stream.problem, stream.fatal) if p]
    wrong += [f"{s}: {e}" for s, e in stream.driver_errors.items()]
    return wrong + [f"no call of {stage}"] * (not any(s == stage for s, _ in stream.calls))


def judged(stage: str, got: Stream, want: Stream) -> list[Violation]:
    """What ``verdict.oracle`` would report of ``got`` (a PR's answers) against ``want``."""
    judge = Judge(stage, "oracle:cpu")
    judge.stage(refkit.specs()[stage], got, want, exact=False, what="differs from the base's")
    return judge.found
