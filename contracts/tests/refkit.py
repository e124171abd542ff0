"""Run one stage's oracle driver on real code and on its float64 reference (tests only).

A stage's float64 reference (``[oracle] references`` in its spec) must agree
with the repository's own code on every call ``reference_calls`` names (the
honest control), and must disagree with a deliberately wrong copy of the
stage (the proof that the reference can see a bug). ``answers`` starts the
same workers ``verdict.oracle`` starts, from this checkout's tree: one on the
real code (optionally edited), one on the reference, same seed; ``judged``
compares them with the verdict's own ``Judge``.

A worker on unedited code gives the same stream for the same request every
time (draws are keyed by the seed), so ``run`` keeps such streams for the
test process: the reference's answers at one seed are computed once for the
honest control and every wrong stage, not once a test.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

from niels_gpt_contracts import specpath
from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.sandbox import oracle_run
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.oracle_run import Job, Stream
from niels_gpt_contracts.stagespec import Spec, load_schema, parse_specs
from niels_gpt_contracts.verdict.oracle_compare import Judge

REPO = Path(__file__).resolve().parents[2]

Edit = Callable[[str], str]  # a module file's text -> the broken text
SEED_VARIABLE = "NIELS_REFERENCE_SEED"


def drawn_seed() -> int:
    """A seed drawn for this run, or ``$NIELS_REFERENCE_SEED`` when set (to rerun one).

    The gate judges with a secret seed drawn per verdict, so a reference must
    agree with main at any seed, not only at the one a test file names. The
    seed is printed: pytest shows it, and the line that reruns it, with a
    failure's captured output.

    Raises ValueError when the variable is set to anything but a positive integer.
    """
    raw = os.environ.get(SEED_VARIABLE)
    if raw is None:
        seed = random.SystemRandom().randrange(1, 2**62)
    elif raw.isascii() and raw.isdigit() and int(raw) > 0:
        seed = int(raw)
    else:
        raise ValueError(f"{SEED_VARIABLE} must be a positive decimal integer, found {raw!r}")
    print(f"drawn seed {seed}; rerun with {SEED_VARIABLE}={seed}")
    return seed


def fixed_and_drawn(fixed: int) -> list[Any]:
    """``pytest.mark.parametrize`` values for a test run at ``fixed`` (id ``"<fixed>"``)
    and at a drawn seed (id ``"drawn"``, marked ``reseeded``: ``.ci/run --full``).

    The drawn case passes None; the test turns it into a seed with ``seed_for``.
    """
    drawn = pytest.param(None, id="drawn", marks=pytest.mark.reseeded)
    return [pytest.param(fixed, id=str(fixed)), drawn]


def wrong_cases(names: Sequence[str], landing: str) -> list[Any]:
    """``pytest.mark.parametrize`` values for a reference's wrong stages, one id a name:
    ``landing`` runs in every run (``test-contracts``, so each landing still proves the
    reference sees a bug), the others are marked ``breadth`` and run in
    ``nox -s test-reseeded`` (``.ci/run --full``) beside the drawn seeds.

    Each wrong stage costs two oracle workers (10 to 30 CPU-s); the full set of
    them was a fifth of ``test-contracts``' CPU time.
    """
    assert landing in names, f"{landing!r} is not among {list(names)}"
    breadth = pytest.mark.breadth
    return [pytest.param(n, id=n, marks=() if n == landing else breadth) for n in names]


def seed_for(seed: int | None) -> int:
    """A ``fixed_and_drawn`` value as a seed: the fixed one, or one drawn now."""
    return drawn_seed() if seed is None else seed


def specs() -> dict[str, Spec]:
    """Every spec of this checkout, parsed as the checker parses them."""
    texts = {f"specs/{p.name}": p.read_text() for p in (REPO / "specs").glob("*.toml")}
    return parse_specs(texts, load_schema((REPO / "specs/spec.schema.json").read_text()))


def _code(dest: Path, edits: Mapping[str, Edit]) -> list[Path]:
    """Copy ``packages/*/src`` under ``dest``, applying ``edits`` (repo path -> edit)."""
    for src in sorted(REPO.glob("packages/*/src")):
        shutil.copytree(
            src, dest / src.relative_to(REPO), ignore=shutil.ignore_patterns("__pycache__")
        )
    for rel, edit in edits.items():
        path = dest / rel
        before = path.read_text()
        after = edit(before)
        assert after != before, f"the edit of {rel} changed nothing"
        path.write_text(after)
    return sorted(p for p in dest.glob("packages/*/src") if p.is_dir())


# Streams of workers on unedited code, by request and the files it names (see ``run``).
_UNEDITED: dict[str, Stream] = {}


def _request_key(request: Mapping[str, Any]) -> str:
    """A request and the content of every driver and reference file it names."""
    digest = hashlib.sha256(json.dumps(request, sort_keys=True).encode())
    files = [d["file"] for d in request["drivers"]] + sorted(request["references"].values())
    for name in files:
        digest.update(Path(name).read_bytes())
    return digest.hexdigest()


def run(box: Sandbox, jobs: Sequence[tuple[Job, bool]], timeout: float) -> list[Stream]:
    """Each job's stream, in order; ``(job, unedited)``: an unedited job's stream is
    taken from an earlier run of the same request in this process, or kept for the next."""
    keys = [_request_key(job.request) if unedited else None for job, unedited in jobs]
    todo = [i for i, key in enumerate(keys) if key is None or key not in _UNEDITED]
    streams, changed = (
        oracle_run.run(box, [jobs[i][0] for i in todo], timeout) if todo else ([], [])
    )
    assert not changed, changed
    fresh = dict(zip(todo, streams, strict=True))
    for i, stream in fresh.items():
        key = keys[i]
        if key is not None and stream.problem is None and stream.fatal is None:
            _UNEDITED[key] = stream
    return [fresh[i] if i in fresh else _UNEDITED[str(keys[i])] for i in range(len(jobs))]


def _preload(all_specs: Mapping[str, Spec]) -> list[str]:
    return [
        rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        for s in all_specs.values()
        for rel in s.modules
    ]


def answers(
    stage: str,
    seed: int,
    scratch: Path,
    *,
    edits: Mapping[str, Edit] | None = None,
    timeout: float = 900.0,
) -> tuple[Stream, Stream]:
    """``stage``'s reference calls on the real code (``edits`` applied) and on its reference.

    The real side runs only the calls ``reference_calls`` names, so the two
    streams answer the same calls.
    """
    all_specs = specs()
    spec = all_specs[stage]
    assert spec.oracle is not None and spec.oracle.references, f"{stage} declares no reference"
    only = list(spec.oracle.reference_calls) or ["*"]
    names = sorted({m.split(".")[0] for s in all_specs.values() for m in _preload({s.id: s})})
    entry = {
        "stage": stage,
        "file": str(REPO / spec.oracle.driver_file),
        "function": spec.oracle.function,
        "watch": {},
        "only": only,
    }
    paths = specpath.driver_path(REPO, [stage])
    common = {"seed": seed, "names": names, "drivers": [entry], "paths": paths}
    real = {**common, "references": {}, "preload": _preload(all_specs)}
    refs = {m: str(REPO / f) for m, f in spec.oracle.references.items()}
    ref = {**common, "references": refs, "preload": []}
    box = Sandbox.prepare(sys.executable, scratch / "box", names, threads=1)
    real_job = Job("real", _code(scratch / "real", edits or {}), real, threads=1)
    ref_job = Job("reference", _code(scratch / "ref", {}), ref, threads=1)
    got, want = run(box, [(real_job, not edits), (ref_job, True)], timeout)
    return got, want


def judged(stage: str, got: Stream, want: Stream) -> list[Violation]:
    """What ``verdict.oracle`` would report of ``got`` against the reference ``want``."""
    assert want.problem is None and want.fatal is None, want.problem or want.fatal
    assert not want.driver_errors, want.driver_errors
    assert want.calls, "the reference answered no call"
    judge = Judge(stage, "oracle:cpu")
    judge.stage(specs()[stage], got, want, exact=True, what="differs from the float64 reference's")
    return judge.found
