"""The rule registry: what every rule id means.

Each fixed id has one ``RuleDoc`` in ``RULES``: a short text, a full
description and help on mending a breach (SARIF shows all three). A rule a
stage's spec defines (``static.<id>``, ``runtime.<id>``) is described by that
spec, stage by stage (``SpecRule``): two stages may define the same id with
different texts. A new fixed id is one entry in ``RULES``; a test fails while
an id the checker emits is unregistered.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RuleDoc:
    """What a rule id means, as SARIF shows it.

    ``short``: one line naming the breach; ``full``: what the rule guards and
    why; ``help``: how to mend a breach.
    """

    short: str
    full: str
    help: str


_GATE_FROM_BASE = (
    "The gate reads the stage's spec from the PR's base revision, so a PR cannot loosen "
    "its own rules."
)

# Every fixed rule id, one entry each. A new id needs one entry here (the
# tests check that every id the checker can emit is registered).
RULES: dict[str, RuleDoc] = {
    "path.meta": RuleDoc(
        "A stage PR changed a meta path.",
        "Meta paths (specs/, contracts/, .github/, .ci/, noxfile.py, constraints.txt, the "
        "root pyproject.toml, .pre-commit-hooks.yaml) decide how every stage is judged, so "
        "they belong to no stage and no stage PR may add, change or delete them.",
        "Move the meta change into its own PR, which a maintainer reviews and merges; keep "
        "the stage PR to the stage's own paths.",
    ),
    "path.forbidden": RuleDoc(
        "The PR changed a path the stage must not change.",
        "The path matches the stage's must_not_change patterns, which win over every "
        "permission. " + _GATE_FROM_BASE,
        "Revert the change to this path; if the stage really needs it, change the spec "
        "first in a separate, reviewed PR.",
    ),
    "path.not-allowed": RuleDoc(
        "The PR changed a path outside the stage's allowlist.",
        "The path matches none of the stage's may_change patterns nor a line-scoped "
        "permission. " + _GATE_FROM_BASE,
        "Revert the change, or move it to a PR of the stage that owns the path.",
    ),
    "path.line-scope": RuleDoc(
        "A file changed beyond what its line-scoped permission allows.",
        "Some files outside the stage may change only on certain lines (for example: only "
        "to add a keyword argument to a call). Both versions are parsed and compared; "
        "every other line must stay identical, and the file may only be edited in place.",
        "Undo the edits the permission does not cover (the message names the permission "
        "and what it allows); keep the file's path and type.",
    ),
    "path.autoload": RuleDoc(
        "A stage PR adds or changes code that loads without an import.",
        "Python and pytest run some files by their name or place alone: conftest.py, "
        "sitecustomize.py, usercustomize.py, *.pth, pytest and tox ini sections, entry "
        "points, build hooks. A stage PR must not bring any, or its code would run inside "
        "the checker's own test runs.",
        "Remove the file or table; put the code in a module that is imported explicitly.",
    ),
    "path.symlink": RuleDoc(
        "A stage PR adds or changes a symbolic link.",
        "A link can make one path read another file than the one judged, so stages ship "
        "regular files only.",
        "Replace the link by a regular file.",
    ),
    "module.unlisted": RuleDoc(
        "A file under the stage's src/ is not a module its spec lists.",
        "A stage owns exactly the modules its spec lists; an unlisted file would ship "
        "code nothing judges.",
        "Remove the file, or list the module in the spec (a maintainer change).",
    ),
    "module.shadowed": RuleDoc(
        "A stage file sits at the path of another stage's module.",
        "Two distributions must never own the same file: one would overwrite or shadow "
        "the other when both are installed.",
        "Move the code into a module the stage owns.",
    ),
    "module.missing": RuleDoc(
        "A module the stage's spec lists is absent.",
        "Every module the spec lists must exist under the stage's src/.",
        "Restore the module at the path the spec lists.",
    ),
    "module.undeclared-import": RuleDoc(
        "A stage module imports a stage it does not depend on.",
        "A stage may import only the stages in its depends_on (and their own dependencies), "
        "so that installing one stage brings everything it needs and nothing more.",
        "Drop the import, or declare the dependency in the spec (a maintainer change).",
    ),
    "source.import": RuleDoc(
        "A stage module imports outside the allowed modules.",
        "Stage code may import the stages' namespace, public torch and pure-computation "
        "standard library modules only, so what it does can be read from its source.",
        "Replace the import by one of the allowed modules.",
    ),
    "source.dynamic": RuleDoc(
        "A stage module builds names or code at run time.",
        "Code built at run time (eval, exec, getattr with computed names, interpreter "
        "internals) hides what runs from every static check.",
        "Write the code out so that it reads as what it does.",
    ),
    "source.name": RuleDoc(
        "A stage module uses a name that is, or reaches, something it may not.",
        "Imported names and attribute chains are checked for what they are, resolved in "
        "an interpreter that imports no code of the PR: a module object such as os, sys, "
        "subprocess or importlib, a function that runs programs or loads code "
        "(torch.utils.collect_env.run), one that changes torch's global state (global "
        "module hooks, seeds, default dtype), or a name another stage's module does not "
        "define or export, whichever allowed module the name is taken from.",
        "Compute with torch's tensor API and the stages' exported names only.",
    ),
    "source.foreign-write": RuleDoc(
        "A stage module writes to something it does not own.",
        "Assigning or deleting an attribute or item of another stage's, torch's or "
        "pytest's modules, classes or functions (directly, through an alias, through "
        "type(x) or x.__class__, or with setattr/delattr), or replacing a module's forward, "
        "changes what other code computes behind its back.",
        "Subclass, wrap or pass values instead; change another stage in that stage's PR.",
    ),
    "api.missing": RuleDoc(
        "A public object the spec lists cannot be imported.",
        "Each object in the stage spec's API must import from its listed module path, in "
        "a fresh interpreter over the tree's packages.",
        "Restore the object at the import path the spec names (or fix the import error "
        "the message shows).",
    ),
    "api.kind": RuleDoc(
        "A public object is not of the kind the spec says.",
        "The spec lists each public object as a module, a function or a class; the "
        "object found must be of that kind.",
        "Make the object the kind the spec lists again.",
    ),
    "api.signature": RuleDoc(
        "A public signature differs from the spec.",
        "Signatures are compared parameter by parameter: name, kind, default and "
        "annotation, and the return annotation; annotations are normalised, so quoting "
        "and spacing do not matter.",
        "Change the signature back to the spec's (the message shows the first difference).",
    ),
    "api.exports": RuleDoc(
        "A module does not export exactly the names the spec lists.",
        "A module's __all__ must name exactly the spec's exports, and each must exist.",
        "Set __all__ to the spec's list and define every name in it.",
    ),
    "api.fields": RuleDoc(
        "A class does not declare exactly the fields the spec lists.",
        "A dataclass-like class must declare exactly the annotated fields the spec "
        "lists, with the same annotations.",
        "Declare the spec's fields, no more and no fewer.",
    ),
    "api.identity": RuleDoc(
        "A re-exported object is not the very object the spec names.",
        "Where the spec says an object is the same as another (a re-export), both paths "
        "must give the identical object, not a copy or a wrapper.",
        "Re-export the original object instead of redefining it.",
    ),
    "api.probe": RuleDoc(
        "The public API could not be inspected.",
        "The API is inspected by importing the tree's packages in a fresh interpreter; an "
        "import that fails or a probe that crashes leaves the API unverified, which "
        "counts as broken.",
        "Fix the import or crash the message shows, so that the API can be inspected.",
    ),
    "api.source": RuleDoc(
        "The reported signature is not the code that runs.",
        "The signature inspect reports must be that of the def that runs: an assigned "
        "__signature__ or a decorator that hides the function, or running code that is "
        "not in the tree, would let the API check pass on something else.",
        "Remove the __signature__ assignment or the hiding wrapper; define the function "
        "in the stage's module.",
    ),
    "invariant.unclaimed": RuleDoc(
        "A spec invariant is claimed by no test.",
        "Every invariant a stage declares must be claimed by at least one test with "
        "@pytest.mark.invariant('<stage>.<id>'), so that some test proves it on every "
        "device.",
        "Add or mark a test that proves the invariant.",
    ),
    "invariant.unknown": RuleDoc(
        "A test claims an invariant no spec declares.",
        "A marker naming an invariant that no spec declares proves nothing the gate can "
        "count (often a typo).",
        "Correct the invariant id in the marker, or declare the invariant in the spec.",
    ),
    "invariant.malformed": RuleDoc(
        "An invariant marker is not a single string literal '<stage>.<id>'.",
        "Claims are read statically, so the marker's argument must be one string literal "
        "of the form '<stage>.<id>'.",
        "Write the marker as @pytest.mark.invariant('<stage>.<id>').",
    ),
    "stage.unspecified": RuleDoc(
        "A stage package has no spec.",
        "Every package under packages/ must be owned by a stage spec in specs/, or "
        "nothing would judge the PRs that change it.",
        "Add a specs/<stage>.toml whose package is this directory (a maintainer change).",
    ),
    "tests.failed": RuleDoc(
        "A test fails on the PR's code.",
        "The base's tests of the stage and of its dependants, the maintainers' acceptance "
        "tests and the PR's own tests all run over the PR's code; every one must pass.",
        "Run the named test on the PR's code and fix the failure.",
    ),
    "tests.skipped": RuleDoc(
        "A reference test skips on the PR's code.",
        "A reference test that runs on the base's code but skips on the PR's proves "
        "nothing there, so it counts as broken.",
        "Make the test run on the PR's code again (see why it skips).",
    ),
    "tests.missing": RuleDoc(
        "A reference test never runs on the PR's code.",
        "Each test the base collects must run on the PR's code; one that disappears "
        "(renamed, deselected, not collected) proves nothing.",
        "Restore the test, or keep it collectable under its name.",
    ),
    "tests.removed": RuleDoc(
        "A stage PR switches off a test of its stage.",
        "The next PR inherits this one's tests. A test the base collects and runs that the "
        "PR's version of the stage's tests deletes, renames, deselects, skips or marks as "
        "an expected failure no longer guards the stage; removing a test is a maintainer's "
        "amendment (a commit with Spec: trailers), not part of a stage PR.",
        "Restore the named test so that it runs and passes, or ask a maintainer to remove "
        "it in an amendment.",
    ),
    "tests.error": RuleDoc(
        "A test run of the verdict could not be read.",
        "A collection error, a time limit or a missing report leaves unknown what the run "
        "would have proved, so nothing in it counts as passed.",
        "Fix the error the message shows and run again.",
    ),
    "tests.weakened": RuleDoc(
        "The PR leaves its stage a weaker test suite than it found.",
        "The reference tests judge a PR with the base's versions of the tests it changed, "
        "so a loosened, skipped or deleted test hides nothing in this PR; but the next PR "
        "inherits this one's versions. The stage's catalogued mutants are run against the "
        "suite the PR leaves (its test files plus the acceptance tests): a mutant the "
        "base's suite kills and this one does not means a test lost its teeth.",
        "Restore the assertion, tolerance or case the change removed, or strengthen a "
        "test until it kills the mutant again.",
    ),
    "device.failed": RuleDoc(
        "A test proving an invariant failed on a device.",
        "The invariant report of a device's test session shows a failing test that "
        "claims the invariant.",
        "Run the named tests on that device (nox -s test-<device>) and fix the failure.",
    ),
    "device.incomplete": RuleDoc(
        "A device run ended in error before the invariant was verified.",
        "The device's test session ended with a non-zero pytest status and no passing "
        "test verified the invariant, so it cannot count as kept.",
        "Fix the error that stopped the run, then run the device session again.",
    ),
    "device.not-run": RuleDoc(
        "An invariant was not verified on a device the run requires.",
        "With --require-device, a device with no report, or whose tests for an invariant "
        "were all skipped, is broken rather than not run: a skip is not a pass.",
        "Run the stage's tests on the device, and make sure the invariant's tests do not "
        "skip there.",
    ),
    "device.stale": RuleDoc(
        "A device report was produced from another tree than the one judged.",
        "Every invariant report records the fingerprint of the stage sources and tests it "
        "ran on; a report whose fingerprint differs from the tree being judged proves "
        "nothing about it, so the device counts as not run (broken when required).",
        "Run the device session again on this tree: nox -s test-<device>.",
    ),
    "device.partial": RuleDoc(
        "A device report covers a narrowed test selection.",
        "A run narrowed with -k, -m, --deselect, node ids, -x or --last-failed (or an old "
        "report that does not say what it covered) may have left out a failing test, so "
        "it counts as not run (broken when required).",
        "Run the whole device session without narrowing options.",
    ),
    "mutant.survived": RuleDoc(
        "A catalogued bug was not caught by the stage's tests.",
        "Each stage's spec lists known bugs (mutants); the tests that claim the stage's "
        "invariants must fail on every one of them.",
        "Strengthen the tests (claiming the right invariant) until they fail on the "
        "mutant; never delete the mutant.",
    ),
    "mutant.stale": RuleDoc(
        "A catalogued bug no longer applies to the code.",
        "A mutant's find text must occur in its module exactly as often as it says; when "
        "the code moves on, the mutant tests nothing until it is rewritten.",
        "Rewrite the mutant's find/replace against the current source.",
    ),
    "mutant.error": RuleDoc(
        "A mutant run ended in error.",
        "A run that times out or crashes does not show the bug was caught, so it counts "
        "against the gate.",
        "Look at the reason in the message; fix the tests or the timeout.",
    ),
    "mutant.pending": RuleDoc(
        "A mutant is still marked for re-targeting.",
        "A maintainers' amendment may mark mutants whose code its stage PR rewrites "
        "(retarget = true): that PR's verdict reports them NOT RUN. Outside that verdict the "
        "mark means a known bug goes unchecked, so the mutant gate fails on it.",
        "Rewrite the mutant's find/replace at the new code (the same bug), prove it killed "
        "(nox -s mutants -- --stage S) and remove the mark, in a maintainers' commit.",
    ),
    "amendment.breaking": RuleDoc(
        "A spec amendment breaks the contract without declaring it.",
        "A commit with a 'Spec: <stage>' trailer amends that stage's spec. A removed or "
        "renamed export or parameter, a changed default or return, a dropped invariant or "
        "rule, a loosened rule, a wider may_change or edited evidence (acceptance tests, "
        "drivers) is BREAKING: users and later PRs relied on it.",
        "Add a 'Spec-Break: <reason>' trailer to the amending commit and bump the spec's "
        "major version, or make the change additive (keyword-only parameters with "
        "defaults that keep today's behaviour, new exports, invariants, rules).",
    ),
    "amendment.version": RuleDoc(
        "A spec amendment's version does not match its change.",
        "The spec's version is the contract's: a BREAKING change needs a major bump, an "
        "ADDITIVE one at least a minor bump, and a version never goes down.",
        "Set version in specs/<stage>.toml as the message says.",
    ),
    "amendment.trailer": RuleDoc(
        "A spec changed without a 'Spec:' trailer naming its stage.",
        "Every commit range that changes a stage's spec or its maintainers' evidence "
        "(specs/<stage>.toml, specs/<stage>/) names the stage in a 'Spec: <stage>' trailer, "
        "so the amendment is judged as one, and a trailer names an existing stage.",
        "Add 'Spec: <stage>' to the amending commit's trailers, or fix the stage's name.",
    ),
    "amendment.path": RuleDoc(
        "A spec amendment changes files outside the amended specs.",
        "An amendment range may change only the named stages' specs/<stage>.toml and "
        "specs/<stage>/ (and, for a declared break, packages/<stage>/tests/): code passed "
        "off as an amendment would escape the stage gate.",
        "Move the other changes into a stage PR ('Stage:' trailer) or a maintainers' change "
        "of their own.",
    ),
    "amendment.invalid": RuleDoc(
        "An amended spec is not valid.",
        "The head's spec is validated with the base's schema: an amendment changes a "
        "contract, not the schema that every contract follows, and it cannot remove a "
        "stage.",
        "Fix the key the message names.",
    ),
    "sandbox.tampered": RuleDoc(
        "A protected file changed while the PR's code ran.",
        "The checker, the sandbox interpreter and the verdict's workspace are hashed "
        "before the PR's code runs and checked after; a change means the PR's code "
        "reached what judges it, and the verdict cannot stand.",
        "Find what in the PR writes outside its own files, and remove it.",
    ),
    "oracle.differs": RuleDoc(
        "The PR's code answers an oracle call unlike the base's code.",
        "The checker drives each closure stage's public API with inputs drawn from a "
        "secret per-verdict seed over the spec's whole domain, in a plain Python process "
        "that looks like a user's, and compares the tensors with the same calls on the "
        "base's code (or the spec's float64 reference) within dtype-derived bounds. A "
        "difference beyond the bound, another exception type or other outputs is a "
        "change of behaviour that no test has to catch.",
        "Reproduce it with the call and inputs the message names (contracts pr "
        "--oracle-seed N replays the seed); make the code compute what the base's does.",
    ),
    "oracle.invariant": RuleDoc(
        "An invariant the oracle checks does not hold on the PR's code.",
        "Where no second implementation can stand in (dropout in training), the oracle's "
        "driver checks the spec's invariants between calls: later tokens never change "
        "earlier outputs, rows of a batch are independent, a padded row equals the row "
        "alone, a cached call equals the uncached one, probabilities are causal.",
        "Reproduce the two calls the message names and make the invariant hold.",
    ),
    "oracle.follows": RuleDoc(
        "A stage that calls the changed one fails the oracle too.",
        "A stage that depends on the stage the PR changes calls its code, so a change of "
        "behaviour there shows up in every dependant's calls. One line per dependant says "
        "so instead of repeating the numbers against files the PR never touched; the "
        "changed stage's own rows say what broke.",
        "Fix the changed stage's rows; the dependants' follow.",
    ),
    "oracle.coverage": RuleDoc(
        "A domain axis the spec declares is never swept by its oracle driver.",
        "A spec's [oracle] axes name the parts of the stage's domain the oracle must draw "
        "from (magnitude, dtype, layout, config, modes, grad2, history, errors, combos). "
        "A driver that never tags a call with one of them leaves that part of the contract "
        "unjudged, so the spec is refused until it does.",
        'Add calls tagged axes=("<axis>",) to the stage\'s driver, or amend the spec.',
    ),
    "oracle.side-effect": RuleDoc(
        "A call left something behind that the base's call does not.",
        "What a call leaves is part of its result: its inputs unchanged, the outputs of "
        "earlier calls unchanged by later ones (no aliasing), and the global state after it "
        "(grad and inference mode, default dtype, threads, deterministic flag, autocast, "
        "whether it drew from the global generator) as the base leaves it.",
        "Return fresh tensors, leave arguments and global state alone, draw as the base does.",
    ),
    "oracle.cost": RuleDoc(
        "A call dispatches far more work than the base's.",
        "The worker counts the ATen ops and FLOPs of calls drawn from the secret seed; more "
        "than 1.5 times the base's (plus a small slack) refuses a slower stage without any "
        "wall clock, so neither a busy machine nor a fast one decides it.",
        "Count the call's ops (a TorchDispatchMode or FlopCounterMode) and remove the extra.",
    ),
    "oracle.memory": RuleDoc(
        "A stage's modules or caches hold far more memory than the base's.",
        "Drivers report the bytes of the storages a module or cache keeps alive "
        "(o.held); more than 1.25 times the base's is refused.",
        "Allocate what is used; keep no copies alive after the call.",
    ),
    "oracle.error": RuleDoc(
        "The oracle could not get an answer from the PR's code.",
        "The PR's worker must import every stage of the tree and run every driver to its "
        "end; a crash, a time-out or an unreadable answer is not evidence that the code "
        "is right, so it counts against the PR.",
        "Read the error in the message; import the stage as a user would and run the call.",
    ),
}

# What each kind of spec-defined static rule checks (rule descriptions).
SPEC_RULE_KINDS: dict[str, str] = {
    "import_as_module": "the module is bound as a module object and its listed attributes "
    "are only called through it, never imported or bound by name",
    "forbidden_name": "none of the listed names appears in the stage's code, as a name, an "
    "attribute, an import or a string argument",
    "forbidden_in_function": "no listed method or function is called inside the named "
    "function (and, where the rule says so, the local helpers it calls)",
    "dependencies": "the package's [project].dependencies name exactly the allowed distributions",
    "forbidden_ops": "no listed ATen op (or, where the rule says so, no dtype or device "
    "change) is dispatched while the rule's driver runs the stage's code",
}


@dataclass(frozen=True)
class SpecRule:
    """A rule one stage's spec defines (``static.<id>``), described by that spec.

    Two stages may define the same id with different texts; each keeps its own.
    """

    stage: str
    rule: str
    kind: str
    message: str
    spec_path: str
    line: int | None = None

    def doc(self) -> RuleDoc:
        where = f"{self.spec_path}:{self.line}" if self.line else self.spec_path
        what = SPEC_RULE_KINDS.get(self.kind, f"a rule of kind {self.kind!r}")
        return RuleDoc(
            self.message,
            f"Stage {self.stage!r} defines rule {self.rule!r} ({self.kind}: {what}) in "
            f"{where}: {self.message}. {_GATE_FROM_BASE}",
            f"Change the code so that the rule holds again ({self.message}); the rule "
            f"itself changes only with the stage's spec, in a maintainer PR.",
        )


def unregistered(rule: str) -> RuleDoc:
    """The description of an id nobody registered (reporters never crash on one)."""
    return RuleDoc(
        f"Rule {rule}.",
        f"Rule {rule!r} has no registered description (a checker bug: register it in "
        "niels_gpt_contracts.rules.RULES).",
        "See the result's message.",
    )
