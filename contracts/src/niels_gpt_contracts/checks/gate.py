"""Run the checks and build one ``Result``.

Two modes:

- tree mode (no base): every stage (or ``--stage``) on the working tree:
  spec, API, static rules, invariant coverage, and device outcomes when
  reports are given.
- PR mode (``--base``): one stage, its spec read from the base revision;
  changed paths from ``merge-base(base, head)`` to head (or the working tree),
  then API, static rules and invariant coverage on the head.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from niels_gpt_contracts.checks import api, devices, invariants, paths, static
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import GitRepo, RevisionTree, Tree, WorkingTree
from niels_gpt_contracts.result import BROKEN, KEPT, Outcome, Result, SpecRule, Violation
from niels_gpt_contracts.spec import (
    SCHEMA_PATH,
    SPECS_DIR,
    Spec,
    load_schema,
    parse_specs,
    spec_path,
)


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


def load_specs(tree: Tree) -> dict[str, Spec]:
    """Every ``specs/*.toml`` of ``tree``, validated, in dependency order."""
    names = [
        f
        for f in tree.files()
        if f.startswith(f"{SPECS_DIR}/") and f.endswith(".toml") and f.count("/") == 1
    ]
    if not names:
        raise ConfigError(
            f"expected stage specs {SPECS_DIR}/*.toml in the {tree.label}, found none"
        )
    texts = tree.read_many([*names, SCHEMA_PATH])
    schema = load_schema(texts.pop(SCHEMA_PATH))
    unreadable = sorted(p for p, t in texts.items() if t is None)
    if unreadable:
        raise ConfigError(
            f"{unreadable[0]}: expected a readable TOML text file, found "
            "something else (symlink or binary)"
        )
    specs = parse_specs({p: t for p, t in texts.items() if t is not None}, schema)
    ordered: list[str] = []

    def visit(stage: str, trail: tuple[str, ...]) -> None:
        if stage in ordered:
            return
        if stage in trail:
            raise ConfigError(
                f"{spec_path(stage)}: depends_on forms a cycle: {' -> '.join((*trail, stage))}"
            )
        for dep in specs[stage].depends_on:
            visit(dep, (*trail, stage))
        ordered.append(stage)

    for stage in sorted(specs):
        visit(stage, ())
    return {s: specs[s] for s in ordered}


def _pick(specs: Mapping[str, Spec], stage: str, where: str) -> Spec:
    if stage not in specs:
        raise ConfigError(
            f"unknown stage {stage!r}: expected one of {', '.join(specs)} "
            f"(specs in {where}), found no {spec_path(stage)}"
        )
    return specs[stage]


def _outcome(stage: str, check: str, violations: list[Violation], kept: str) -> Outcome:
    if violations:
        n = len(violations)
        return Outcome(stage, check, BROKEN, f"{n} violation{'s' * (n != 1)}", violations)
    return Outcome(stage, check, KEPT, kept)


def _stage_checks(
    result: Result,
    spec: Spec,
    specs: Mapping[str, Spec],
    tree: Tree,
    claims: list[invariants.Claim],
    api_found: Mapping[str, list[Violation]] | None,
    changed_lines: Mapping[str, set[int]] | None,
) -> None:
    if api_found is not None:
        result.outcomes.append(
            _outcome(spec.id, "api", api_found.get(spec.id, []), f"{len(spec.api)} objects match")
        )
    stat = static.check_static(spec, tree, changed_lines)
    result.outcomes.append(_outcome(spec.id, "static", stat, f"{len(spec.rules)} rules hold"))
    inv, claimed = invariants.check_invariants(spec, specs, claims)
    result.outcomes.append(
        _outcome(spec.id, "invariants", inv, f"{claimed}/{len(spec.invariants)} invariants claimed")
    )


def _device_rows(
    result: Result,
    spec: Spec,
    reports: Mapping[str, devices.DeviceReport | None],
    required: tuple[str, ...],
) -> None:
    for device in devices.DEVICES:
        if device in reports or device in required:
            result.outcomes.append(
                devices.device_outcome(spec, device, reports.get(device), device in required)
            )


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
        [_pick(specs, request.stage, "the working tree")] if request.stage else list(specs.values())
    )
    reports = devices.load_reports(request.reports_dir, request.report_files)
    result = Result(
        mode="tree", stages=[s.id for s in chosen], required_devices=request.require_devices
    )
    _add_rule_texts(result, chosen)
    api_found = api.check_api(chosen, tree) if request.api else None
    claims = invariants.scan_claims(tree)
    for spec in chosen:
        result.outcomes.append(Outcome(spec.id, "spec", KEPT, f"{spec.path} valid"))
        _stage_checks(result, spec, specs, tree, claims, api_found, None)
        _device_rows(result, spec, reports, request.require_devices)
    if not request.stage:
        unowned = invariants.check_unowned(specs, claims, tree.files())
        result.outcomes.append(
            _outcome("repo", "stages", unowned, f"every package has a spec ({len(specs)})")
        )
    return result


def stage_from_trailers(repo: GitRepo, merge_base: str, head: str) -> str:
    found = repo.stage_trailers(merge_base, head)
    stages = sorted({s for _, s in found})
    span = f"{merge_base[:12]}..{head[:12]}"
    if not stages:
        raise ConfigError(
            f"expected a 'Stage: <id>' trailer in the commits {span}, found none "
            "(add one, or pass --stage)"
        )
    if len(stages) > 1:
        detail = ", ".join(f"{c} says {s!r}" for c, s in found)
        raise ConfigError(
            f"expected one stage in the 'Stage:' trailers of {span}, found {len(stages)}: {detail}"
        )
    return stages[0]


def run_pr(request: Request) -> Result:
    assert request.base is not None
    _check_devices(request.require_devices)
    repo = GitRepo.discover(request.repo)
    base = repo.resolve(request.base, "base revision")
    head = repo.resolve(request.head, "head revision") if request.head else None
    head_commit = head or repo.resolve("HEAD", "HEAD")
    merge_base = repo.merge_base(base, head_commit)
    base_tree = RevisionTree(repo, base)
    specs = load_specs(base_tree)
    stage = request.stage or stage_from_trailers(repo, merge_base, head_commit)
    spec = _pick(specs, stage, f"base {request.base}")
    reports = devices.load_reports(request.reports_dir, request.report_files)

    changes = repo.changes(merge_base, head)
    head_tree: Tree = RevisionTree(repo, head) if head else WorkingTree(repo)
    result = Result(
        mode="pr",
        stages=[spec.id],
        base=base,
        head=head,
        merge_base=merge_base,
        required_devices=request.require_devices,
    )
    _add_rule_texts(result, [spec])
    result.outcomes.append(Outcome(spec.id, "spec", KEPT, f"{spec.path} at base {base[:12]} valid"))
    path_violations, judged = paths.check_paths(
        spec, changes, RevisionTree(repo, merge_base), head_tree
    )
    result.changed_paths = judged
    result.outcomes.append(
        _outcome(spec.id, "paths", path_violations, f"{judged} changed paths allowed")
    )
    changed = {p for c in changes for p in c.paths()}
    api_found = api.check_api([spec], head_tree) if request.api else None
    claims = invariants.scan_claims(head_tree)
    changed_lines = _LazyLines(repo, merge_base, head, changed)
    _stage_checks(result, spec, specs, head_tree, claims, api_found, changed_lines)
    _device_rows(result, spec, reports, request.require_devices)
    return result


class _LazyLines(Mapping[str, set[int]]):
    """Changed lines per changed path, asked of git only for paths looked up."""

    def __init__(self, repo: GitRepo, base: str, head: str | None, paths: set[str]) -> None:
        self.repo, self.base, self.head, self.paths = repo, base, head, paths
        self.cache: dict[str, set[int]] = {}

    def __getitem__(self, path: str) -> set[int]:
        if path not in self.paths:
            raise KeyError(path)
        if path not in self.cache:
            self.cache[path] = self.repo.changed_lines(self.base, self.head, path)
        return self.cache[path]

    def __contains__(self, path: object) -> bool:
        return path in self.paths

    def __iter__(self) -> Iterator[str]:
        return iter(self.paths)

    def __len__(self) -> int:
        return len(self.paths)


def _add_rule_texts(result: Result, specs: list[Spec]) -> None:
    for spec in specs:
        for rule in spec.rules:
            result.add_spec_rule(
                SpecRule(spec.id, rule.rule_id, rule.kind, rule.message, spec.path, rule.line)
            )


def run(request: Request) -> Result:
    if request.head and not request.base:
        raise ConfigError("--head: expected --base REV with it, found --head alone")
    return run_pr(request) if request.base else run_tree(request)
