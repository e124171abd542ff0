"""A maintainers' spec amendment, judged: trailers, paths, classification, version.

A range whose commits carry ``Spec: <stage>`` trailers (and no ``Stage:``
trailer) amends existing stages' contracts. For each named stage the
merge-base's spec and the head's are compared (``spec_diff``), and so are the
files of its evidence the range touches (``evidence_diff``): acceptance tests
and drivers under ``specs/<stage>/``, and, in a declared break, the stage's own
tests. The change is the worst level found:

- ``KEPT``: nothing in the contract moved (exit 0 whatever the version, as
  long as it does not go down);
- ``ADDITIVE``: needs at least a minor version bump;
- ``BREAKING``: needs a major version bump and a ``Spec-Break: <reason>``
  trailer on a commit that names the stage; else BROKEN (exit 1).

A major bump with a ``Spec-Break:`` trailer declares a break the data cannot
show (a behaviour described in a comment). The range may touch nothing but
the named stages' ``specs/<stage>.toml`` and ``specs/<stage>/``, a spec kit
file under ``specs/_kit/`` when it names every stage whose spec declares that
file, in the base or the head (``checks.context.speckit``), plus
``packages/<stage>/tests/`` of a declared break, and under their ``src/``
only moves that change no code (a file renamed with its content unchanged, a
package's code moved verbatim from its ``__init__.py`` into one named module
beside it, leaving an ``__init__.py`` that only re-exports, and an empty
``py.typed`` marker added or removed): a contributor cannot pass
code off as an amendment, and the schema is the checker's, not a stage's.
A stage's changelog (``specs/<stage>/CHANGELOG.md``, ``checks.spec_changes.changelog``)
needs the stage's trailer like its spec, and moves no level: it is prose.
The head's specs are validated with the base's schema. Who may amend is
decided outside the gate (review of ``specs/``); the gate judges what.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import tomllib
from packaging.version import Version

from niels_gpt_contracts.checks.context import speckit
from niels_gpt_contracts.checks.context.loading import load_specs
from niels_gpt_contracts.checks.evidence.coverage import check_coverage
from niels_gpt_contracts.checks.spec_changes import changelog
from niels_gpt_contracts.checks.spec_changes.evidence_diff import compare_file
from niels_gpt_contracts.checks.spec_changes.reexports import reexports_only
from niels_gpt_contracts.checks.spec_changes.spec_diff import Change, classify, worst
from niels_gpt_contracts.errors import ConfigError, SpecErrors
from niels_gpt_contracts.gitdiff import Change as PathChange
from niels_gpt_contracts.gitdiff import GitRepo, RevisionTree, Tree, WorkingTree
from niels_gpt_contracts.result import BROKEN, KEPT, Outcome, Result, Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.stagespec import (
    SCHEMA_PATH,
    SPECS_DIR,
    Spec,
    import_name,
    load_schema,
    parse_spec,
)

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
AMENDMENT_BREAKING = Rule(
    "amendment.breaking",
    "A spec amendment breaks the contract without declaring it.",
    "A commit with a 'Spec: <stage>' trailer amends that stage's spec. A removed or "
    "renamed export or parameter, a changed default or return, a dropped invariant or "
    "rule, a loosened rule, a wider may_change or edited evidence (acceptance tests, "
    "drivers) is BREAKING: users and later PRs relied on it.",
    "Add a 'Spec-Break: <reason>' trailer to the amending commit and bump the spec's "
    "major version, or make the change additive (keyword-only parameters with "
    "defaults that keep today's behaviour, new exports, invariants, rules).",
)

AMENDMENT_VERSION = Rule(
    "amendment.version",
    "A spec amendment's version does not match its change.",
    "The spec's version is the contract's: a BREAKING change needs a major bump, an "
    "ADDITIVE one at least a minor bump, and a version never goes down.",
    "Set version in specs/<stage>.toml as the message says.",
)

AMENDMENT_TRAILER = Rule(
    "amendment.trailer",
    "A spec changed without a 'Spec:' trailer naming its stage.",
    "Every commit range that changes a stage's spec or its maintainers' evidence "
    "(specs/<stage>.toml, specs/<stage>/) names the stage in a 'Spec: <stage>' trailer, "
    "so the amendment is judged as one, and a trailer names an existing stage.",
    "Add 'Spec: <stage>' to the amending commit's trailers, or fix the stage's name.",
)

AMENDMENT_PATH = Rule(
    "amendment.path",
    "A spec amendment changes files outside the amended specs.",
    "An amendment range may change only the named stages' specs/<stage>.toml and "
    "specs/<stage>/ (and, for a declared break, packages/<stage>/tests/): code passed "
    "off as an amendment would escape the stage gate.",
    "Move the other changes into a stage PR ('Stage:' trailer) or a maintainers' change "
    "of their own.",
)

AMENDMENT_INVALID = Rule(
    "amendment.invalid",
    "An amended spec is not valid.",
    "The head's spec is validated with the base's schema: an amendment changes a "
    "contract, not the schema that every contract follows, and it cannot remove a "
    "stage.",
    "Fix the key the message names.",
)

SHOWN = 8  # changes named in a row's summary
OUTSIDE = (
    "an amendment changes only specs/<stage>.toml and specs/<stage>/ of the stages its "
    "'Spec:' trailers name (a declared break, 'Spec-Break:', also their packages' tests/); "
    "anything else is a stage PR or a maintainers' change of its own"
)


def _v(rule: str, path: str | None, message: str, stage: str = "repo") -> Violation:
    return Violation(rule, path, None, message, stage, "amendment")


def _version(text: str | None) -> Version:
    """A spec's ``MAJOR.MINOR.PATCH`` (the schema's pattern) as a ``packaging`` version;
    a spec without one (schema 2) is 0.0.0."""
    return Version(text or "0.0.0")


def _owner(path: str, specs: Mapping[str, Spec]) -> tuple[str | None, str]:
    """``(stage, part)`` a path belongs to: ``spec``, its ``changelog``, ``evidence``,
    ``tests``, the spec kit (``kit``, every stage that declares it: ``_kit_path``), or no
    stage (``other``)."""
    if speckit.in_kit(path):
        return None, "kit"
    if path.startswith(f"{SPECS_DIR}/") and path.count("/") == 1 and path.endswith(".toml"):
        return path[len(SPECS_DIR) + 1 : -len(".toml")], "spec"
    if changelog.is_changelog(path):
        return path.split("/")[1], "changelog"  # the spec's prose: named, never compared
    if path.startswith(f"{SPECS_DIR}/") and path.count("/") >= 2:
        return path.split("/")[1], "evidence"
    for spec in specs.values():
        if path.startswith(f"{spec.package}/tests/"):
            return spec.id, "tests"
    return None, "other"


def _summary(level: str, declared: bool, before: str, after: str, changes: list[Change]) -> str:
    label = f"{level} (declared break)" if declared and level != "BREAKING" else level
    rank = {"BREAKING": 0, "ADDITIVE": 1, "KEPT": 2}  # what decided the level first
    shown = [c.what for c in sorted(changes, key=lambda c: rank[c.level])][:SHOWN]
    more = len(changes) - len(shown)
    text = f"{label} {before} -> {after}"
    if shown:
        text += ": " + "; ".join(shown) + (f"; (+{more} more)" if more > 0 else "")
    return text


class _Judge:
    """One amendment range: the trees, the trailers, and the rows they give."""

    def __init__(self, repo: GitRepo, merge_base: str, head: str | None, named: set[str]) -> None:
        self.before: Tree = RevisionTree(repo, merge_base)
        self.after: Tree = RevisionTree(repo, head) if head else WorkingTree(repo)
        self.specs = load_specs(self.before)
        self.schema = load_schema(self.before.read(SCHEMA_PATH))
        self.named = named
        self.renames: dict[str, str] = {}  # old path -> new path, as git pairs them

    def kit_loaders(self, kit_file: str) -> set[str]:
        """The stages whose specs declare ``kit_file``, in the base or the head."""
        found: set[str] = set()
        for tree in (self.before, self.after):
            kit = speckit.kit_texts(tree.files(), tree.read_many)
            found |= speckit.users(self._declarations(tree), kit_file, kit)
        return found

    def _declarations(self, tree: Tree) -> dict[str, tuple[str, ...]]:
        """Stage -> the kit modules its spec in ``tree`` declares (read leniently: the
        head's specs are validated stage by stage, later)."""
        out: dict[str, tuple[str, ...]] = {}
        for stage in sorted(set(self.specs) | self.named):
            text = tree.read(f"{SPECS_DIR}/{stage}.toml")
            try:
                out[stage] = speckit.declared_in(tomllib.loads(text or ""))
            except tomllib.TOMLDecodeError:
                out[stage] = ()
        return out

    def stage(self, stage: str, paths: list[str], declared: bool) -> list[Outcome]:
        path = f"{SPECS_DIR}/{stage}.toml"
        before, after = self.before.read(path), self.after.read(path)
        if after is None:
            v = _v(AMENDMENT_INVALID.id, path, "an amendment cannot remove a stage's spec", stage)
            return [Outcome(stage, "amendment", BROKEN, "spec removed", [v])]
        try:
            head_spec = parse_spec(path, after, self.schema)
        except SpecErrors as err:
            invalid = [
                Violation(AMENDMENT_INVALID.id, e.path, e.line, str(e), stage, "spec")
                for e in err.errors
            ]
            return [Outcome(stage, "spec", BROKEN, "the amended spec is not valid", invalid)]
        rows = [Outcome(stage, "spec", KEPT, f"{path} at head valid (base's schema)")]
        unswept = check_coverage(head_spec, self.after)  # declared axes the driver never sweeps
        if unswept:
            return [*rows, Outcome(stage, "coverage", BROKEN, "a declared axis unswept", unswept)]
        own = [f for f in self.after.files() if f.startswith(f"{SPECS_DIR}/{stage}/")]
        hidden = speckit.undeclared(head_spec, dict(self.after.read_many(own)))
        if hidden:  # a kit import the declaration does not show
            return [*rows, Outcome(stage, "speckit", BROKEN, "an undeclared kit import", hidden)]
        if before is None:
            why = f"new stage spec {head_spec.version}: its first PR adds the package"
            return [*rows, Outcome(stage, "amendment", KEPT, why)]
        changes = classify(tomllib.loads(before), tomllib.loads(after))
        was = {new: old for old, new in self.renames.items()}
        for p in paths:
            if self.renames.get(p) in paths:
                continue  # compared with its new self, below
            old = was.get(p)
            before = self.before.read(old or p)
            changes += compare_file(p, before, self.after.read(p), self.renames, old)
        level = worst(changes)
        bv, hv = self.specs[stage].version, head_spec.version
        b, h = _version(bv), _version(hv)
        found: list[Violation] = []

        def fail(rule: str, message: str) -> None:
            found.append(_v(rule, path, message, stage))

        if h < b:
            fail(AMENDMENT_VERSION.id, f"expected a version >= the base's {bv}, found {hv}")
        elif (level == "BREAKING" or declared) and h.major <= b.major:
            want = f"{b.major + 1}.0.0"
            fail(AMENDMENT_VERSION.id, f"expected a major bump for a break ({want}), found {hv}")
        elif level == "ADDITIVE" and (h.major, h.minor) <= (b.major, b.minor):
            want = f"{b.major}.{b.minor + 1}.0"
            fail(AMENDMENT_VERSION.id, f"expected a minor bump for ADDITIVE ({want}), found {hv}")
        if level == "BREAKING" and not declared:
            breaks = "; ".join(c.what for c in changes if c.level == "BREAKING")
            fail(
                AMENDMENT_BREAKING.id,
                f"expected a 'Spec-Break: <reason>' trailer on a commit naming {stage}, "
                f"for these BREAKING changes: {breaks}",
            )
        summary = _summary(level, declared, str(bv), str(hv), changes)
        return [*rows, Outcome(stage, "amendment", BROKEN if found else KEPT, summary, found)]


def _split(j: _Judge, changes: list[PathChange], srcs: tuple[str, ...]) -> set[str]:
    """A package's code moved verbatim out of its ``__init__.py`` into a module added
    beside it, the ``__init__.py`` left re-exporting only (``checks.spec_changes.reexports``): both
    paths. Git shows the pair as the ``__init__.py`` modified and the module added."""
    added = {c.path for c in changes if c.status == "A" and c.path.endswith(".py")}
    out: set[str] = set()
    for c in changes:
        if c.status != "M" or not c.path.endswith("/__init__.py") or not c.path.startswith(srcs):
            continue
        before = j.before.read(c.path)
        folder = c.path.removesuffix("__init__.py")
        moved = [p for p in added if p.startswith(folder) and "/" not in p[len(folder) :]]
        verbatim = [p for p in moved if before is not None and j.after.read(p) == before]
        src = next(s for s in srcs if c.path.startswith(s))
        package = import_name(c.path.removeprefix(src))
        if len(verbatim) == 1 and reexports_only(j.after.read(c.path), package):
            out |= {c.path, verbatim[0]}
    return out


def _moves(j: _Judge, changes: list[PathChange], named: set[str]) -> set[str]:
    """Paths under a named stage's ``src/`` that change no code: a file renamed with its
    content unchanged (a module that becomes a package of its own), a package's code
    moved verbatim from its ``__init__.py`` into a named module (``_split``), and an
    empty ``py.typed`` marker added or removed (PEP 561)."""
    srcs = tuple(f"{j.specs[s].src}/" for s in named if s in j.specs)
    out: set[str] = _split(j, changes, srcs)
    for c in changes:
        if not all(p.startswith(srcs) for p in c.paths()):
            continue
        if c.status == "R" and c.old_path is not None:
            same = j.before.read(c.old_path) == j.after.read(c.path) is not None
            markers = c.old_path.endswith("/py.typed") and c.path.endswith("/py.typed")
            if same and (markers and j.after.read(c.path) == ""):
                out |= {c.old_path, c.path}  # git pairs empty markers across packages
            elif same and c.old_path.split("/", 2)[:2] == c.path.split("/", 2)[:2]:
                out |= {c.old_path, c.path}  # within one package, content unchanged
        elif c.path.endswith("/py.typed") and c.status in ("A", "D"):
            side = j.after if c.status == "A" else j.before
            if side.read(c.path) == "":
                out.add(c.path)
    return out


def _paths(
    j: _Judge, changes: list[PathChange], named: set[str], declared: set[str]
) -> tuple[list[Violation], dict[str, list[str]]]:
    """Path violations of the range, and each named stage's touched evidence files."""
    loose: list[Violation] = []
    touched: dict[str, list[str]] = {s: [] for s in named}
    moves = _moves(j, changes, named)
    for path in sorted({p for c in changes for p in c.paths()}):
        stage, part = _owner(path, j.specs)
        if path in moves:
            continue  # a named stage's module moved as it is, or an empty py.typed marker
        if part == "kit":
            loose += _kit_path(j, path, touched)
        elif stage is not None and part != "other" and stage not in named:
            why = f"changes stage {stage!r}'s contract without a 'Spec: {stage}' trailer"
            loose.append(_v(AMENDMENT_TRAILER.id, path, why))
        elif part == "other" or (part == "tests" and stage not in declared):
            loose.append(_v(AMENDMENT_PATH.id, path, OUTSIDE))
        elif stage is not None and part not in ("spec", "changelog"):
            touched[stage].append(path)
        if j.after.is_symlink(path):
            loose.append(_v(AMENDMENT_PATH.id, path, "expected a regular file, found a link"))
    return loose, touched


def _kit_path(j: _Judge, path: str, touched: dict[str, list[str]]) -> list[Violation]:
    """A kit file is evidence of each stage that declares it, before or after: each must
    be named, and the file is compared as that stage's own (``checks.context.speckit``)."""
    loaders = j.kit_loaders(path)
    for stage in sorted(loaders & j.named):
        touched[stage].append(path)
    return [
        _v(
            AMENDMENT_TRAILER.id,
            path,
            f"changes the spec kit {stage!r} declares without a 'Spec: {stage}' trailer",
        )
        for stage in sorted(loaders - j.named)
    ]


def judge(repo_dir: Path, base_rev: str, head_rev: str | None) -> Result | None:
    """The amendment verdict of ``merge-base(base, head)..head``; ``None`` when no commit
    carries a ``Spec:`` trailer (not an amendment: the stage gate judges it)."""
    repo = GitRepo.discover(repo_dir)
    base = repo.resolve(base_rev, "base revision")
    head = repo.resolve(head_rev, "head revision") if head_rev else None
    head_commit = head or repo.resolve("HEAD", "HEAD")
    merge_base = repo.merge_base(base, head_commit)
    spec_trailers = repo.trailers(merge_base, head_commit, "Spec")
    if not spec_trailers:
        return None
    span = f"{merge_base[:12]}..{head_commit[:12]}"
    stage_trailers = repo.trailers(merge_base, head_commit, "Stage")
    if stage_trailers:
        raise ConfigError(
            f"expected a stage PR ('Stage:' trailers) or a spec amendment ('Spec:' trailers) "
            f"in {span}, found both: amend the spec in its own commits, before the stage PR"
        )
    changes = repo.changes(merge_base, head)
    if not changes:
        raise ConfigError(f"expected an amendment that changes something, found nothing in {span}")
    named = {stage for _, stage in spec_trailers}
    breaking = {c for c, reason in repo.trailers(merge_base, head_commit, "Spec-Break") if reason}
    declared = {stage for c, stage in spec_trailers if c in breaking}
    j = _Judge(repo, merge_base, head, named)
    j.renames = {c.old_path: c.path for c in changes if c.status == "R" and c.old_path}
    result = Result("pr", stages=sorted(named), base=base, head=head, merge_base=merge_base)
    result.changed_paths = len(changes)
    loose, touched = _paths(j, changes, named, declared)
    known = set(j.specs) | {s for s in named if j.after.read(f"{SPECS_DIR}/{s}.toml")}
    for stage in sorted(named - known):
        loose.append(_v(AMENDMENT_TRAILER.id, None, f"'Spec: {stage}' names no stage's spec"))
    for stage in sorted(named & known):
        result.outcomes += j.stage(stage, touched[stage], stage in declared)
    n = len(changes)
    kept = f"{n} changed path{'s' * (n != 1)}: specs and evidence of {', '.join(sorted(named))}"
    result.outcomes.append(Outcome("repo", "amendment", BROKEN if loose else KEPT, kept, loose))
    return result
