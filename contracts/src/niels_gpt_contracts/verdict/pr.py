"""``contracts pr``: the whole verdict on one stage's PR, as phases, cheapest first.

``phases`` lists them; ``pipeline`` runs them, hands each row to the caller
as soon as it is known, times each phase, and stops at the first BROKEN row
unless ``--full`` (the rest are NOT RUN rows that say so). In order:

1. ``static``: nothing of the PR runs: the base's specs, the diff, paths and
   self-loading files, module ownership, readable source, static rules and
   invariant claims (``checks``). Every checker module was imported and is
   hashed first (``integrity``).
2. ``environment``: the sandbox interpreter (``--python``, or built from the
   base's ``constraints.txt`` in the cache, sealed and verified: ``env_trust``)
   and a workspace written out of git objects (``files``). The guard
   snapshots what the runs must not change; where Linux allows, the sandbox
   interpreter runs behind read-only mounts (``confine``).
3. ``api``: the public API, imported in the sandbox; ``names``: the stage's
   library names resolved there (``outside_tests``); ``protocol``: what every
   ``nn.Module`` promises (state_dict, round trips, hooks, init, global
   state, memory, compilation), each exported module class on the PR
   against the base (``protocol``).
4. per device, ``runtime:<d>`` (the drivers' ATen ops), on the CPU
   ``oracle:cpu`` (the differential oracle, ``outside_tests``/``oracle``), and
   ``tests:<d>`` (the reference tests, the PR's tests, the ratchet, the
   ``tests = true`` runtime rules; ``testing``), which also gives the
   ``device:<d>`` row.
5. ``mutants``: every catalogued bug of the closure, killed by the reference
   tests (``mutation``), stopping at the first survivor unless ``--full``;
   ``weakened``: a PR that changed its stage's tests, measured by the same
   mutants (``outside_tests``/``weakened``).
6. ``sandbox`` (always, once the PR's code ran): the checker's files, the
   whole sandbox environment and the workspace are unchanged.

The ``Result`` is built in memory from validated data.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from niels_gpt_contracts import device_probe
from niels_gpt_contracts.checks.context import importers, pr_context
from niels_gpt_contracts.checks.evidence import devices, invariants
from niels_gpt_contracts.checks.ownership.modules import namespaces
from niels_gpt_contracts.checks.public_api import api
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.mutants.store import Cache
from niels_gpt_contracts.result import Outcome, Result, Violation
from niels_gpt_contracts.sandbox import confine, env_trust, processes, runtime_probe, workspace
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.stagespec import Rule
from niels_gpt_contracts.verdict import (
    amendment,
    files,
    integrity,
    outside_tests,
    pipeline,
    plan,
    runtime,
    static_verdict,
    testing,
)
from niels_gpt_contracts.verdict.integrity import SANDBOX_TAMPERED
from niels_gpt_contracts.verdict.mutation import CACHE_NAME, run_mutants
from niels_gpt_contracts.verdict.pipeline import Phase
from niels_gpt_contracts.verdict.state import Environment, PrRequest, Say, State


def _outcome(stage: str, check: str, found: list[Violation], kept: str) -> Outcome:
    if found:
        return Outcome(stage, check, "BROKEN", f"{len(found)} violation(s)", found)
    return Outcome(stage, check, "KEPT", kept)


def _interpreter(given: str) -> str:
    """``--python`` as an absolute path: the sandbox's runs start in other folders.

    A bare name is looked up on PATH. The path is made absolute, never resolved
    through links: a venv's ``python`` is a link, and resolving it would leave
    the venv. Raises ``ConfigError`` when nothing executable is there.
    """
    found = shutil.which(given)
    if found is None:
        raise ConfigError(
            f"--python: expected an executable python interpreter, found none at {given!r}"
        )
    return os.path.abspath(found)


# --- the phases ----------------------------------------------------------------


def static_phase(v: State) -> None:
    """Rows from git alone: spec, paths, autoload, modules, source, static, invariants.

    Also decides the runs (``plan``): a path the path check rejected is never
    taken from the head.
    """
    ctx = v.ctx
    static_verdict.judge_pr_static(ctx, v.result)
    rejected = {x.path for x in v.result.violations if x.path is not None}
    v.plan = plan.make_plan(
        ctx.spec,
        ctx.specs,
        ctx.changes,
        ctx.base_tree.files(),
        ctx.head_tree.files(),
        rejected,
        importers.uses(ctx.specs, ctx.base_tree),
    )
    static_verdict.add_rule_texts(v.result, v.plan.closure)
    v.claims = invariants.scan_claims(ctx.head_tree)
    v.claims += invariants.scan_claims(ctx.base_tree, v.plan.reference_from_base)
    static_verdict.stage_checks(
        v.result, v.ctx.spec, v.ctx.specs, v.ctx.head_tree, v.claims, None, v.ctx.changed_lines
    )


def environment_phase(v: State) -> None:
    """The sandbox interpreter and the workspace; the guard's first snapshot (``v.env``)."""
    w = files.write_workspace(v.ctx, v.plan, v.scratch)
    constraints = v.ctx.base_tree.read("constraints.txt") or ""
    python = v.python_given or env_trust.build(v.request.cache, constraints, v.say)
    box = Sandbox.prepare(python, w.root / "sandbox", namespaces(v.ctx.specs), threads=1)
    guard = integrity.Guard.take([*box.trusted_paths(), *w.watched(), str(box.boot)])
    # Where Linux allows: every run of the sandbox interpreter behind read-only mounts.
    watched: list[str | Path] = [*guard.roots, guard.package, v.request.cache]
    confined, confinement = confine.confined(box, [*watched, v.request.repo])
    v.env = Environment(python, w, confined, guard)
    v.say(f"sandbox interpreter {python} ({confinement}); workspace {w.root}")


EnvPhase = Callable[[State, Environment], Iterator[Outcome]]


def after_environment(fn: EnvPhase) -> Callable[[State], Iterator[Outcome]]:
    """``fn`` as a phase, given the ``Environment`` the environment phase made (it is
    listed after that phase, which a verdict stopped before never reaches).

    Raises:
        RuntimeError: the phase runs without an environment (a wrongly ordered list).
    """

    def phase(v: State) -> Iterator[Outcome]:
        if v.env is None:
            raise RuntimeError(f"{fn.__name__} runs before the environment phase")
        return fn(v, v.env)

    return phase


def api_phase(v: State, env: Environment) -> Iterator[Outcome]:
    owned = [f for s in v.ctx.specs.values() for f in s.module_files]
    spec = v.ctx.spec
    base = (v.ctx.base_tree, owned)  # a timeout is judged against the base's own probe
    found = api.check_api([spec], v.ctx.head_tree, env.box.python, env.box.environ([]), owned, base)
    processes.reap_orphans()
    yield _outcome(spec.id, "api", found.get(spec.id, []), f"{len(spec.api)} objects match")


def _usable(v: State, env: Environment, device: str) -> Iterator[Outcome]:
    """Probe ``device`` by computing on it; a row saying why when it cannot run the tests."""
    if device not in v.usable:
        found = device_probe.probe(device, python=env.box.python) if device != "cpu" else None
        v.usable[device] = found is None or found.ok
        if found is not None and not found.ok:
            why = f"{device} not usable here, tests not run: {found.reason}"
            spec = v.ctx.spec
            if device in v.request.require_devices:
                w = Violation(
                    devices.DEVICE_NOT_RUN.id, spec.path, None, why, spec.id, f"device:{device}"
                )
                yield Outcome(spec.id, f"device:{device}", "BROKEN", why, [w])
            else:
                yield Outcome(spec.id, f"device:{device}", "NOT RUN", why)


def runtime_phase(device: str) -> EnvPhase:
    def phase(v: State, env: Environment) -> Iterator[Outcome]:
        yield from _usable(v, env, device)
        if not v.usable[device]:
            return
        box, drivers, roots = env.box, env.w.drivers, workspace.src_roots(env.w.head)
        rules = v.plan.rules()
        # The drivers run under the profiler, one after the other in a process:
        # split them over the cores, one probe process each.
        parts = [[r for _, r in rules[i :: v.jobs]] for i in range(min(v.jobs, len(rules)))]

        def probe(part: list[Rule]) -> runtime_probe.ProbeRun:
            return runtime_probe.run(box, part, device=device, drivers_root=drivers, roots=roots)

        with ThreadPoolExecutor(max_workers=max(1, len(parts))) as pool:
            probes = list(pool.map(probe, parts))
        merged = runtime_probe.ProbeRun(device)
        for one in probes:
            merged.recorded.update(one.recorded)
            merged.problem = merged.problem or one.problem
        broken = runtime.judge(rules, merged, v.stage)
        yield _outcome(v.stage, f"runtime:{device}", broken, f"{len(rules)} runtime rule(s) hold")

    return phase


def tests_phase(device: str) -> EnvPhase:
    def phase(v: State, env: Environment) -> Iterator[Outcome]:
        yield from _usable(v, env, device)
        if not v.usable[device]:
            return
        runner = testing.Runner(env.box, env.w, v.jobs, v.request.timeout)
        found, runs = testing.tests_on(runner, v.plan, device, v.say)
        yield _outcome(v.stage, f"tests:{device}", found, testing.summary(runs))
        required = device in v.request.require_devices
        report = testing.device_counts(runs)
        yield devices.device_outcome(v.ctx.spec, device, report, required)

    return phase


def mutants_phase(v: State, env: Environment) -> Iterator[Outcome]:
    if not v.request.mutants:
        why = "skipped (--skip-mutants: a device job beside a full verdict)"
        yield Outcome(v.stage, "mutants", "NOT RUN", why)
        return
    v.mutants_row = run_mutants(v.ctx, v.plan, env.w, env.box, v.request, v.kills, v.say)
    yield v.mutants_row


def sandbox_phase(v: State) -> Iterator[Outcome]:
    """The guard's verdict on whatever of the PR's code ran (nothing before ``environment``)."""
    if v.env is None:
        return
    tampered = v.env.guard.changes()
    if tampered and v.python_given is None:
        # Never reuse an environment the PR's code may have poisoned.
        env_trust.discard(Path(v.env.python).parent.parent)
    message = "changed while the PR's code ran: the PR's code wrote outside its sandbox"
    found = [
        Violation(SANDBOX_TAMPERED.id, p, None, message, v.stage, "sandbox") for p in tampered[:20]
    ]
    yield _outcome(v.stage, "sandbox", found, "checker, interpreter and workspace unchanged")


def phases(request: PrRequest) -> list[Phase]:
    """The verdict's phases in the order they run: cheapest first."""

    def env(name: str, checks: tuple[str, ...], fn: EnvPhase) -> Phase:
        return Phase(name, checks, after_environment(fn))

    out = [
        Phase("static", (), static_phase),
        Phase("environment", (), environment_phase),
        env("api", ("api",), api_phase),
        env("names", ("names",), outside_tests.names_phase),
        env("protocol", ("protocol",), outside_tests.protocol_phase),
    ]
    for d in request.devices:
        out.append(env(f"runtime:{d}", (f"runtime:{d}",), runtime_phase(d)))
        if d == "cpu":  # the decisive check, dearer than the drivers, cheaper than the tests
            out.append(env("oracle:cpu", ("oracle:cpu",), outside_tests.oracle_phase))
        out.append(env(f"tests:{d}", (f"tests:{d}", f"device:{d}"), tests_phase(d)))
    out.append(env("mutants", ("mutants",), mutants_phase))
    out.append(env("weakened", ("weakened",), outside_tests.weakened_phase))
    out.append(Phase("sandbox", ("sandbox",), sandbox_phase, always=True))
    return out


def run(request: PrRequest, say: Say, on_row: pipeline.OnRow) -> Result:
    """The verdict; ``ConfigError`` when it cannot be given (exit 2, never a pass).

    ``say``: progress lines (the sandbox interpreter, the mutants); ``on_row``:
    each row as soon as it is known, with the seconds since the first phase.
    """
    start = time.monotonic()
    # This process writes no bytecode: every new file on the watched paths is the PR's.
    sys.dont_write_bytecode = True
    python_given = _interpreter(request.python) if request.python else None
    if request.stage is None:  # 'Spec:' trailers: a maintainers' amendment, judged statically
        judged = amendment.judge(request.repo, request.base, request.head)
        if judged is not None:
            return judged
    integrity.preload()
    processes.become_subreaper()
    ctx = pr_context.open_pr(request.repo, request.base, request.head, request.stage)
    result = ctx.result(request.require_devices)
    request.cache.mkdir(parents=True, exist_ok=True)
    kills = Cache(request.cache / CACHE_NAME, True)  # read now, before any PR code runs
    with tempfile.TemporaryDirectory(prefix="contracts-pr-") as tmp:
        jobs = max(1, request.jobs or os.cpu_count() or 1)
        v = State(request, ctx, result, say, kills, Path(tmp), jobs, python_given)
        pipeline.run(phases(request), v, result, ctx.spec.id, on_row, full=request.full)
    result.seconds = time.monotonic() - start
    return result
