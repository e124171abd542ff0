"""The differential oracle's verdict (``oracle:cpu``), decided in this process.

For every stage of the closure whose spec declares ``[oracle]``, the base's
driver drives the stage's public API in up to three workers
(``sandbox.oracle_run``), started together:

- ``head``: the PR's code, every stage of the tree imported as a user would;
  the ATen ops of the calls the driver marks for a runtime rule are recorded;
- ``base``: the base's code, the same calls;
- ``reference:<stage>``, one per stage whose spec names float64 references
  and either is new here (its first PR: every call) or lists
  ``reference_calls``: its references loaded in place of its modules, the
  other stages the base's code.

The PR's answer to a call the reference answered must agree with the
reference's, and with the base's too, except where the base itself differs
from the reference: there the spec decides, not history (a PR that fixes a
bug of the base is judged by the reference alone on those calls, and a PR
that keeps the bug is BROKEN). A stage above the PR's is judged over the
base's code of the PR's stage: where a fix below shows in its calls, those
differ from its base and are BROKEN as following from the PR's stage.

Inputs and weights come from a seed drawn here with ``secrets``, for this
verdict alone (``--oracle-seed`` replays a printed one). The workers return
tensors; ``oracle_compare`` judges them here. The PR's worker failing is
BROKEN; the base's or the reference's failing is a ``ConfigError`` (exit 2).
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from niels_gpt_contracts import specpath
from niels_gpt_contracts.checks.context import pr_context
from niels_gpt_contracts.checks.ownership.modules import namespaces
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.result import BROKEN, KEPT, NOT_RUN, Outcome, Violation
from niels_gpt_contracts.sandbox import oracle_run, workspace
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.oracle_run import Job, Stream
from niels_gpt_contracts.stagespec import Spec
from niels_gpt_contracts.verdict import explain, files, oracle_aftermath, plan, repro
from niels_gpt_contracts.verdict.integrity import SANDBOX_TAMPERED
from niels_gpt_contracts.verdict.oracle_compare import ORACLE_ERROR, Judge, differs_from

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).

CHECK = "oracle:cpu"


def oracle_stages(p: plan.Plan) -> list[Spec]:
    """The closure's stages that declare an oracle, in spec order."""
    return [s for s in p.closure if s.oracle is not None]


def _modules(specs: Sequence[Spec], files: set[str]) -> list[str]:
    """Every stage module present in a tree, as an import name (what the worker imports)."""
    out = []
    for spec in specs:
        for rel, path in zip(spec.modules, spec.module_files, strict=True):
            if path in files:
                out.append(rel.removesuffix(".py").removesuffix("/__init__").replace("/", "."))
    return out


def _entry(spec: Spec, root: Path, *, watch: bool = False, **run: Sequence[str]) -> dict[str, Any]:
    """A worker's request entry for ``spec``'s driver; ``watch``: record ops (the PR's side)."""
    assert spec.oracle is not None
    rules = {r.id: bool(r.params.get("casts")) for r in spec.rules if r.runtime} if watch else {}
    entry: dict[str, Any] = {
        "stage": spec.id,
        "file": str(root / spec.oracle.driver_file),
        "function": spec.oracle.function,
        "watch": rules,
    }
    entry.update({k: list(v) for k, v in run.items()})
    return entry


def _paths(root: Path, specs: Sequence[Spec]) -> list[str]:
    """The spec kit's folder and the drivers' stage folders under ``root`` (``specpath``)."""
    return specpath.driver_path(root, [s.id for s in specs])


def _reference_job(
    spec: Spec, based: list[Spec], common: dict[str, Any], base_code: Path, root: Path
) -> Job:
    """``spec``'s reference worker: its own references in place of its modules, every
    other stage the base's code; its reference calls (every call when it is new).

    Only the stage's own: references of several stages do not all compose (the
    backbone's float64 GPT cannot hold a float32 KV cache), and a worker that
    fails is no verdict.
    """
    assert spec.oracle is not None
    modules = {m: str(root / f) for m, f in spec.oracle.references.items()}
    only = spec.oracle.reference_calls if spec in based else ("*",)
    request = {**common, "preload": [], "references": modules, "paths": _paths(root, [spec]),
               "drivers": [_entry(spec, root, only=only)]}  # fmt: skip
    return Job(f"reference:{spec.id}", workspace.src_roots(base_code), request, threads=1)


def _jobs(
    ctx: pr_context.PrContext,
    stages: list[Spec],
    based: list[Spec],
    refs: list[Spec],
    code: tuple[Path, Path],
    root: Path,
    seed: int,
) -> list[Job]:
    everyone = list(ctx.specs.values())
    common = {"seed": seed, "names": sorted(namespaces(ctx.specs)), "references": {}}
    head = {
        **common,
        "preload": _modules(everyone, set(ctx.head_tree.files())),
        "paths": _paths(root, stages),
        "drivers": [_entry(s, root, watch=True) for s in stages],
    }
    base = {
        **common,
        "preload": _modules(everyone, set(ctx.base_tree.files())),
        "paths": _paths(root, based),
        "drivers": [_entry(s, root) for s in based if s.oracle],
    }
    jobs = [
        Job("head", workspace.src_roots(code[0]), head),
        Job("base", workspace.src_roots(code[1]), base, threads=1),
    ]
    jobs += [_reference_job(s, based, common, code[1], root) for s in refs]
    return jobs


def judge(
    ctx: pr_context.PrContext,
    p: plan.Plan,
    box: Sandbox,
    code: tuple[Path, Path],
    say: Callable[[str], None],
    seed: int | None = None,
    timeout: float = 900.0,
    out: Path | None = None,
) -> Outcome:
    """The ``oracle:cpu`` row; ``code`` holds the head's and the base's written sources.

    A BROKEN row names a reproducer written under ``out`` (``verdict.repro``).

    Raises:
        ConfigError: the base's or the reference's worker failed (no verdict).
    """
    stage = p.stage.id
    stages = oracle_stages(p)
    if not stages:
        return Outcome(stage, CHECK, NOT_RUN, "no stage of the closure declares an oracle")
    seed = secrets.randbits(63) if seed is None else seed
    base_files = set(ctx.base_tree.files())
    based = [s for s in stages if any(f in base_files for f in s.module_files)]
    refs = [s for s in stages if s.oracle and (s not in based or s.oracle.reference_calls)]
    missing = [s for s in stages if s not in based and not (s.oracle and s.oracle.references)]
    if missing:
        why = f"{missing[0].id} is new here and its [oracle] names no float64 reference"
        found = [Violation(ORACLE_ERROR.id, missing[0].path, None, why, stage, CHECK)]
        return Outcome(stage, CHECK, BROKEN, "nothing to compare a first PR with", found)
    root = code[0].parent / "oracle"
    workspace.write(ctx.base_tree, files.driver_files(ctx.base_tree, stages), root)
    say(f"oracle: {', '.join(s.id for s in stages)}, seed {seed:#x}")
    jobs = _jobs(ctx, stages, based, refs, code, root, seed)
    streams, changed = oracle_run.run(box, jobs, timeout, watched=[root, *code])
    say("oracle: " + ", ".join(f"{s.label} {s.seconds:.1f} s" for s in streams))
    if changed:
        why = f"{changed[0]} changed while the oracle's workers ran ({len(changed)} file(s))"
        found = [Violation(SANDBOX_TAMPERED.id, changed[0], None, why, stage, CHECK)]
        return Outcome(stage, CHECK, BROKEN, "the oracle's code or drivers changed", found)
    for trusted in streams[1:]:
        errors = list(trusted.driver_errors.values())
        problem = trusted.problem or trusted.fatal or (errors[0] if errors else None)
        if problem:
            raise ConfigError(f"the oracle's {trusted.label} worker failed: {problem}")
    by_stage = {s.id: streams[2 + i] for i, s in enumerate(refs)}
    unswept = _unswept(stages, streams[1:])
    if unswept:
        raise ConfigError(f"the oracle's trusted drivers left a declared axis unswept: {unswept}")
    depends = explain.depends(ctx.specs, p.uses)
    edited = frozenset(path for c in ctx.changes for path in c.paths())
    outcome, j = _decide(
        stage, stages, based, by_stage, streams[0], streams[1], seed, depends, edited
    )
    picks = explain.smallest(j.failed, stage)
    if out is not None and picks:
        ref = by_stage.get(stage, Stream("reference"))
        _reproduce(ctx, p.stage, box, (code, root), timeout, seed, outcome, picks, {
            False: streams[1], True: ref
        }, out, streams[0])  # fmt: skip
    return outcome


def _reproduce(
    ctx: pr_context.PrContext,
    spec: Spec,
    box: Sandbox,
    where: tuple[tuple[Path, Path], Path],
    timeout: float,
    seed: int,
    outcome: Outcome,
    picks: list[explain.Failed],
    wants: dict[bool, Stream],
    out: Path,
    head: Stream,
) -> None:
    """Capture ``picks`` on the PR's code (in a worker) and name the reproducer in ``outcome``.

    The capture runs the stage's calls in the order the PR's worker ran them,
    up to the last pick: each pick's reproducer can replay what came before it
    (``repro.shrink`` keeps the shortest prefix that still fails).
    """
    code, root = where
    order = [n for s, n in head.calls if s == spec.id and not n.endswith("#capture")]
    wanted = {f.name for f in picks}
    last = max((i for i, n in enumerate(order) if n in wanted), default=-1)
    only = [*order[: last + 1], *(n for n in sorted(wanted) if n not in order)]
    request = {
        "seed": seed,
        "names": sorted(namespaces(ctx.specs)),
        "references": {},
        "preload": _modules(list(ctx.specs.values()), set(ctx.head_tree.files())),
        "paths": _paths(root, [spec]),
        "drivers": [{**_entry(spec, root, only=[_literal(n) for n in only]), "capture": True}],
    }
    job = Job("capture", workspace.src_roots(code[0]), request)
    (got,), changed = oracle_run.run(box, [job], timeout, watched=[root, *code])
    if changed:
        why = f"{changed[0]} changed while the reproducer's capture ran"
        outcome.violations.append(
            Violation(SANDBOX_TAMPERED.id, changed[0], None, why, spec.id, CHECK)
        )
        return
    names = {n for s in ctx.specs.values() for n in _modules([s], set(s.module_files))}
    try:
        script = repro.write(out, spec.id, picks, got, wants, names, order)
        note = repro.shrink(box, workspace.src_roots(code[0]), script, timeout)
        outcome.summary += f"; reproducer: {script}" + (f" ({note})" if note else "")
    except repro.Refused as err:
        problem = got.problem or got.fatal or got.driver_errors.get(spec.id)
        outcome.summary += f"; no reproducer ({err}{'; ' + problem if problem else ''})"


def _literal(name: str) -> str:
    """``name`` as an fnmatch pattern that matches it alone (the worker's ``only``)."""
    return re.sub(r"([*?[])", r"[\1]", name)


def _unswept(stages: list[Spec], trusted: list[Stream]) -> str | None:
    """The first declared axis (``[oracle].axes``) no trusted call of its stage carried.

    The static check (``checks/evidence/coverage``) reads the drivers; this one sees what ran.
    A call that raised sweeps only the ``errors`` axis: a driver whose magnitude
    calls all raise (a keyword the API does not take, say) judges no magnitude.
    """
    for spec in stages:
        if spec.oracle is None or not spec.oracle.axes:
            continue
        carried = {
            a
            for s in trusted
            for (st, _), c in s.calls.items()
            if st == spec.id
            for a in c.axes
            if c.error is None or a == "errors"
        }
        missing = [a for a in spec.oracle.axes if a not in carried]
        if missing:
            return f"{spec.id}: {missing[0]}"
    return None


def diverged(spec: Spec, base: Stream, ref: Stream) -> set[str]:
    """Calls of ``spec`` whose base answer is not within the reference's bound: on
    those the spec decides, and the base's answer is history, not evidence."""
    out = set()
    for (stage, name), want in ref.calls.items():
        got = base.calls.get((stage, name))
        if stage == spec.id and got is not None and differs_from(got, want, exact=True):
            out.add(name)
    return out


def _decide(
    stage: str,
    stages: list[Spec],
    based: list[Spec],
    refs: dict[str, Stream],
    head: Stream,
    base: Stream,
    seed: int,
    depends: dict[str, set[str]],
    changed: frozenset[str] = frozenset(),
) -> tuple[Outcome, Judge]:
    j = Judge(stage, CHECK, changed)
    problem = head.problem or head.fatal
    if problem:
        j.add(stages[0], ORACLE_ERROR.id, f"the PR's code gave no usable answer: {problem}")
        return Outcome(stage, CHECK, BROKEN, "the PR's oracle worker failed", j.found), j
    history = 0  # calls where the base differs from the reference
    for spec in stages:
        ref = refs.get(spec.id)
        if spec in based:
            skip = diverged(spec, base, ref) if ref is not None else set()
            history += len(skip)
            j.stage(spec, head, base, exact=False, what="differs from the base's", skip=skip)
            j.runtime(spec, head, base)
            oracle_aftermath.stage(j, spec, head, base)
        if ref is not None:
            j.stage(spec, head, ref, exact=True, what="differs from the float64 reference's")
            j.runtime(spec, head, ref)
    note = (
        f"; the base differs from the float64 reference on {history} call(s), judged by "
        "the reference alone"
        if history
        else ""
    )
    if j.found:
        found = explain.summarise(*j.contracts_first(), stage, depends)
        summary = f"{len(found)} violation(s) (seed {seed:#x}){note}"
        return Outcome(stage, CHECK, BROKEN, summary, found), j
    summary = (
        f"{j.compared} calls of {len(stages)} stage(s) agree, {j.relations} invariants hold "
        f"(seed {seed:#x}){note}"
    )
    return Outcome(stage, CHECK, KEPT, summary), j
