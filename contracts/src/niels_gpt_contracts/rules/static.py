"""The rule ids of what is judged before any test runs: paths, owned modules,
the stage's source, its public API, invariant claims, stage specs, and a
maintainers' spec amendment.

``STATIC`` maps each id to its ``RuleDoc``; ``rules.RULES`` merges it with
the other families.
"""

from __future__ import annotations

from niels_gpt_contracts.rules.doc import GATE_FROM_BASE, RuleDoc

STATIC: dict[str, RuleDoc] = {
    "path.meta": RuleDoc(
        "A stage PR changed a meta path.",
        "Meta paths (specs/, contracts/, .github/, .ci/, noxfile.py and noxkit/, "
        "constraints.txt, the root pyproject.toml, .pre-commit-hooks.yaml) decide how every "
        "stage is judged, so "
        "they belong to no stage and no stage PR may add, change or delete them.",
        "Move the meta change into its own PR, which a maintainer reviews and merges; keep "
        "the stage PR to the stage's own paths.",
    ),
    "path.forbidden": RuleDoc(
        "The PR changed a path the stage must not change.",
        "The path matches the stage's must_not_change patterns, which win over every "
        "permission. " + GATE_FROM_BASE,
        "Revert the change to this path; if the stage really needs it, change the spec "
        "first in a separate, reviewed PR.",
    ),
    "path.not-allowed": RuleDoc(
        "The PR changed a path outside the stage's allowlist.",
        "The path matches none of the stage's may_change patterns nor a line-scoped "
        "permission. " + GATE_FROM_BASE,
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
}
