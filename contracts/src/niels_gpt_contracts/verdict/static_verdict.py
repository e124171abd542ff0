"""The verdict of ``contracts check``: run the checks and build one ``Result``.

Two modes:

- tree mode (no base): every stage (or ``--stage``) on the working tree:
  spec, API, static rules, invariant coverage, and device outcomes when
  reports are given.
- PR mode (``--base``): one stage, its spec read from the base revision;
  changed paths from ``merge-base(base, head)`` to head (or the working tree),
  then API, static rules and invariant coverage on the head.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from niels_gpt_contracts import fingerprint
from niels_gpt_contracts.checks.code import device_branches, name_rules, source, static
from niels_gpt_contracts.checks.context import pr_context, speckit
from niels_gpt_contracts.checks.context.loading import load_specs, pick
from niels_gpt_contracts.checks.evidence import coverage, devices, invariants
from niels_gpt_contracts.checks.ownership import autoload, modules, paths
from niels_gpt_contracts.checks.public_api import api
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import GitRepo, Tree, WorkingTree
from niels_gpt_contracts.mutants import targets
from niels_gpt_contracts.result import BROKEN, KEPT, NOT_RUN, Outcome, Result, SpecRule, Violation
from niels_gpt_contracts.stagespec import SPECS_DIR, Spec
from niels_gpt_contracts.verdict import amendment


@dataclass
class Request:
    """What the CLI asked for."""

    repo: Path = Path()
    stage: str | None = None
    base: str | None = None
    head: str | None = None
    reports_dir: Path | None = None
    report_files: list[Path] = field(default_factory=list)
    require_devices: tuple[str, ...] = ()
    api: bool = True
    python: str | None = None  # the interpreter that imports the stages (default: this one)


def _outcome(stage: str, check: str, violations: list[Violation], kept: str) -> Outcome:
    if violations:
        n = len(violations)
        return Outcome(stage, check, BROKEN, f"{n} violation{'s' * (n != 1)}", violations)
    return Outcome(stage, check, KEPT, kept)


def stage_checks(
    result: Result,
    spec: Spec,
    specs: Mapping[str, Spec],
    tree: Tree,
    claims: list[invariants.Claim],
    api_found: Mapping[str, list[Violation]] | None,
    changed_lines: Mapping[str, set[int]] | None,
    interpreter: name_rules.Interpreter | None = None,
) -> None:
    """The per-stage rows; ``interpreter`` resolves library names (``source.name``)."""
    if api_found is not None:
        result.outcomes.append(
            _outcome(spec.id, "api", api_found.get(spec.id, []), f"{len(spec.api)} objects match")
        )
    owned = modules.check_modules(spec, specs, tree)
    result.outcomes.append(
        _outcome(spec.id, "modules", owned, f"owns exactly {len(spec.modules)} module(s)")
    )
    shared = modules.namespaces(specs)
    src = source.check_source(spec, tree.read_many(spec.module_files), shared)
    src += name_rules.check_names(spec, specs, tree, shared, interpreter)
    result.outcomes.append(_outcome(spec.id, "source", src, "source readable"))
    stat = static.check_static(spec, tree, changed_lines)
    n_static = sum(not r.runtime for r in spec.rules)
    result.outcomes.append(_outcome(spec.id, "static", stat, f"{n_static} rules hold"))
    inv, claimed = invariants.check_invariants(spec, specs, claims)
    result.outcomes.append(
        _outcome(spec.id, "invariants", inv, f"{claimed}/{len(spec.invariants)} invariants claimed")
    )


def _device_rows(
    result: Result,
    spec: Spec,
    reports: Mapping[str, devices.DeviceReport | None],
    required: tuple[str, ...],
    tree: str | None,
    absent: tuple[str, ...] = (),
) -> None:
    for device in devices.DEVICES:
        if device in absent:
            continue  # reported once for the whole repository (see run_tree)
        if device in reports or device in required:
            report, needed = reports.get(device), device in required
            result.outcomes.append(devices.device_outcome(spec, device, report, needed, tree))


def _check_devices(required: tuple[str, ...]) -> None:
    unknown = [d for d in required if d not in devices.DEVICES]
    if unknown:
        raise ConfigError(
            f"--require-device: expected {', '.join(devices.DEVICES)}, found {', '.join(unknown)}"
        )


def run_tree(request: Request) -> Result:
    _check_devices(request.require_devices)
    repo = GitRepo.discover(request.repo)
    tree = WorkingTree(repo)
    specs = load_specs(tree)
    chosen = (
        [pick(specs, request.stage, "the working tree")] if request.stage else list(specs.values())
    )
    reports = devices.load_reports(request.reports_dir, request.report_files)
    current = fingerprint.tree(repo.root) if reports else None
    # A device with no report at all gets one NOT RUN row, not one per stage.
    absent = tuple(
        d
        for d in devices.DEVICES
        if d in reports and reports[d] is None and d not in request.require_devices
    )
    result = Result(
        mode="tree", stages=[s.id for s in chosen], required_devices=request.require_devices
    )
    add_rule_texts(result, chosen)
    files = tree.files()
    pending = {s.id for s in chosen if not any(f.startswith(f"{s.package}/") for f in files)}
    built = [s for s in chosen if s.id not in pending]
    python = request.python or sys.executable
    api_found = api.check_api(built, tree, python) if request.api else None
    claims = invariants.scan_claims(tree)
    for spec in chosen:
        result.outcomes.append(Outcome(spec.id, "spec", KEPT, f"{spec.path} valid"))
        if spec.oracle is not None and spec.oracle.axes:  # the driver sweeps what the spec declares
            swept = coverage.check_coverage(spec, tree)
            result.outcomes.append(_outcome(spec.id, "coverage", swept, coverage.summary(spec)))
        own = [f for f in files if f.startswith(f"{SPECS_DIR}/{spec.id}/")]
        hidden = speckit.undeclared(spec, tree.read_many(own))  # the kit imports it declares
        if hidden or speckit.declared(spec):  # a row where there is a kit to speak of
            kit_used = f"spec kit imports declared: {', '.join(speckit.declared(spec))}"
            result.outcomes.append(_outcome(spec.id, "speckit", hidden, kit_used))
        if spec.id in pending:
            # The maintainers' spec and acceptance tests land before the stage's first PR.
            why = f"pending: {spec.package} does not exist yet; its first PR adds it"
            result.outcomes.append(Outcome(spec.id, "stage", NOT_RUN, why))
            continue
        names_in = (sys.executable, None) if request.api else None
        stage_checks(result, spec, specs, tree, claims, api_found, None, names_in)
        if spec.mutants:  # each catalogued bug still finds the code it patches
            found = targets.stale_targets(spec, tree)
            result.outcomes.append(_outcome(spec.id, targets.CHECK, found.stale, found.summary()))
        _device_rows(result, spec, reports, request.require_devices, current, absent)
    for device in absent:
        why = f"no report for {device}: its tests have not run here (nox -s test-{device})"
        result.outcomes.append(Outcome("repo", f"device:{device}", NOT_RUN, why))
    if not request.stage:
        unowned = invariants.check_unowned(specs, claims, tree.files())
        result.outcomes.append(
            _outcome("repo", "stages", unowned, f"every package has a spec ({len(specs)})")
        )
    return result


def run_pr(request: Request) -> Result:
    """The static PR gate: the base's spec on the PR's paths and head (see ``pr_context``)."""
    _check_devices(request.require_devices)
    ctx = pr_context.open_pr(request.repo, request.base or "", request.head, request.stage)
    reports = devices.load_reports(request.reports_dir, request.report_files)
    result = ctx.result(request.require_devices)
    add_rule_texts(result, [ctx.spec])
    judge_pr_static(ctx, result)
    python = request.python or sys.executable
    base = (ctx.base_tree, None)  # a timeout is judged against the base's own probe
    api_found = api.check_api([ctx.spec], ctx.head_tree, python, base=base) if request.api else None
    claims = invariants.scan_claims(ctx.head_tree)
    names_in = (sys.executable, None) if request.api else None
    stage_checks(
        result, ctx.spec, ctx.specs, ctx.head_tree, claims, api_found, ctx.changed_lines, names_in
    )
    current = fingerprint.tree(ctx.repo.root) if reports else None
    _device_rows(result, ctx.spec, reports, request.require_devices, current)
    return result


def judge_pr_static(ctx: pr_context.PrContext, result: Result) -> None:
    """The spec, paths and self-loading rows of a PR gate."""
    spec = ctx.spec
    result.outcomes.append(
        Outcome(spec.id, "spec", KEPT, f"{spec.path} at base {ctx.base[:12]} valid")
    )
    path_violations, judged = paths.check_paths(spec, ctx.changes, ctx.base_side, ctx.head_tree)
    result.changed_paths = judged
    result.outcomes.append(
        _outcome(spec.id, "paths", path_violations, f"{judged} changed paths allowed")
    )
    loading = autoload.check_autoload(spec, ctx.changes, ctx.base_side, ctx.head_tree)
    result.outcomes.append(
        _outcome(spec.id, "autoload", loading, "no self-loading file, table or link")
    )
    branches = device_branches.check(ctx)
    result.outcomes.append(
        _outcome(spec.id, device_branches.CHECK, branches, "no new branch on the device type")
    )


def add_rule_texts(result: Result, specs: list[Spec]) -> None:
    """Register each spec's own rules, so reports describe them stage by stage."""
    for spec in specs:
        for rule in spec.rules:
            result.add_spec_rule(
                SpecRule(spec.id, rule.rule_id, rule.kind, rule.message, spec.path, rule.line)
            )


def run(request: Request) -> Result:
    if request.head and not request.base:
        raise ConfigError("--head: expected --base REV with it, found --head alone")
    if request.base and request.stage is None:  # 'Spec:' trailers: a maintainers' amendment
        judged = amendment.judge(request.repo, request.base, request.head)
        if judged is not None:
            return judged
    return run_pr(request) if request.base else run_tree(request)
