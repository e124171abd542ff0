"""The PR under judgement: revisions, the base's specs, the stage, the diff.

``open_pr`` resolves ``base`` and ``head`` (``None``: the working tree), their
merge-base, reads every spec from the base (never from the PR), picks the
stage (``--stage`` or the commits' ``Stage:`` trailers) and lists the changed
paths. An empty PR is a configuration error: there is nothing to judge.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from niels_gpt_contracts.checks.context.loading import load_specs, pick
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import Change, GitRepo, RevisionTree, Tree, WorkingTree
from niels_gpt_contracts.result import Result
from niels_gpt_contracts.stagespec import Spec


@dataclass
class PrContext:
    repo: GitRepo
    base: str
    head: str | None
    merge_base: str
    specs: dict[str, Spec]
    spec: Spec
    changes: list[Change]
    base_tree: RevisionTree
    base_side: RevisionTree
    head_tree: Tree
    changed_lines: Mapping[str, set[int]] = field(repr=False)

    def result(self, required: tuple[str, ...] = ()) -> Result:
        return Result(
            mode="pr",
            stages=[self.spec.id],
            base=self.base,
            head=self.head,
            merge_base=self.merge_base,
            required_devices=required,
        )


def open_pr(repo_dir: Path, base_rev: str, head_rev: str | None, stage: str | None) -> PrContext:
    """Everything the PR gate reads from git, before any check runs."""
    repo = GitRepo.discover(repo_dir)
    base = repo.resolve(base_rev, "base revision")
    head = repo.resolve(head_rev, "head revision") if head_rev else None
    head_commit = head or repo.resolve("HEAD", "HEAD")
    merge_base = repo.merge_base(base, head_commit)
    base_tree = RevisionTree(repo, base)
    specs = load_specs(base_tree)
    chosen = stage or stage_from_trailers(repo, merge_base, head_commit)
    spec = pick(specs, chosen, f"base {base_rev}")
    changes = repo.changes(merge_base, head)
    if not changes:
        raise ConfigError(
            f"expected a PR that changes something, found no changed path from merge-base "
            f"{merge_base[:12]} to {head[:12] if head else 'the working tree'} (nothing to judge)"
        )
    head_tree: Tree = RevisionTree(repo, head) if head else WorkingTree(repo)
    changed = {p for c in changes for p in c.paths()}
    return PrContext(
        repo,
        base,
        head,
        merge_base,
        specs,
        spec,
        changes,
        base_tree,
        RevisionTree(repo, merge_base),
        head_tree,
        _LazyLines(repo, merge_base, head, changed),
    )


def stage_from_trailers(repo: GitRepo, merge_base: str, head: str) -> str:
    if merge_base == head:
        raise ConfigError(f"no commits between base and head (head {head[:12]} is in base)")
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
