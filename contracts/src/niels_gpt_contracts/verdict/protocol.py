"""The module protocol (``protocol``): what every ``nn.Module`` promises, the PR against the base.

No spec lists it and no stage writes a driver for it: every ``nn.Module``
class the closure's stages export (their spec's API: ``class`` entries and a
module's ``exports``) is built on the base's code and on the PR's from one
configuration drawn from a secret seed, and judged by ``protocol_rules``:
state_dict, strict load of the base's weights and the base's outputs,
pickle/save/deepcopy, hooks, init statistics, global state, held memory and
compilation. A second, real-model size (GPT-2 small's ``C = 768`` with 2304-
or 3072-row layers, ``T`` drawn up to 1024) is judged on outputs alone.

The base's worker (one thread) and the PR's run side by side; the base's
leaves the weights its modules held (checked against the digest it reports),
and a second PR worker loads them. The
workers report figures (``sandbox.protocol_run``); this module decides. A
base that cannot be probed is no verdict (``ConfigError``, exit 2); a PR
whose worker fails where the base's finished is BROKEN.
"""

from __future__ import annotations

import ast
import random
import secrets
import shutil
from collections.abc import Callable, Mapping, Sequence
from collections.abc import Set as AbstractSet
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from niels_gpt_contracts.checks.context import pr_context
from niels_gpt_contracts.checks.ownership.modules import namespaces
from niels_gpt_contracts.digests import file_digest
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import GitRepo
from niels_gpt_contracts.result import BROKEN, KEPT, NOT_RUN, Outcome, Violation
from niels_gpt_contracts.sandbox import confine, protocol_run, workspace
from niels_gpt_contracts.sandbox.environment import Sandbox, Snapshot
from niels_gpt_contracts.stagespec import Spec
from niels_gpt_contracts.verdict import plan
from niels_gpt_contracts.verdict.integrity import SANDBOX_TAMPERED
from niels_gpt_contracts.verdict.protocol_rules import PROTOCOL_ERROR, Pair, judge

CHECK = "protocol"
CONFIG = "ModelConfig"  # the class every stage's modules are built from
REAL_C, REAL_H, REAL_FF, REAL_T = 768, 12, 3072, 1024  # GPT-2 small's widths
MAX_ROWS = 12  # violations one row lists


def module_classes(closure: Sequence[Spec]) -> list[str]:
    """``module:qualname`` of every class the closure's specs export but the config,
    sorted: ``class`` entries, and a module's ``exports`` no entry calls anything
    else, named as classes are (CapWords). The worker keeps the ``nn.Module`` ones
    and probes a class named twice once; with none left no worker starts."""
    kinds = {e.object: e.kind for spec in closure for e in spec.api}
    found: set[str] = set()
    for spec in closure:
        for entry in spec.api:
            if entry.kind == "class":
                found.add(entry.object)
            elif entry.kind == "module":
                for name in entry.exports or ():
                    dotted = f"{entry.object}:{name}"
                    if kinds.get(dotted, "class") == "class" and name[:1].isupper():
                        found.add(dotted)
    return sorted(c for c in found if c.rpartition(":")[2] != CONFIG)


DECODE_PARAMETER = "compile_step"  # a function taking it compiles its decode steps


def decoders(closure: Sequence[Spec], specs: Sequence[Spec]) -> list[list[str]]:
    """``[label, "module:function", "module:ModelClass"]`` of every function the closure's
    specs pin with a ``compile_step`` parameter, sorted; the model class is the one
    its first parameter is annotated with, among the classes every spec exports
    (``module_classes``: a stage the PR builds on, backbone_v1's ``GPT``, included).
    A decoder whose model is no exported class is left out."""
    classes = {c.rpartition(":")[2]: c for c in module_classes(specs)}
    found = []
    for spec in closure:
        for entry in spec.api:
            if entry.kind != "function" or not entry.signature:
                continue
            try:
                tree = ast.parse(f"def _{entry.signature}: pass")
            except SyntaxError:
                continue
            fn = tree.body[0]
            assert isinstance(fn, ast.FunctionDef)
            params = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
            if DECODE_PARAMETER not in {a.arg for a in params} or not params:
                continue
            first = params[0].annotation
            model = classes.get(ast.unparse(first)) if first is not None else None
            if model is not None:
                found.append([entry.object, entry.object, model])
    return sorted(found)


def config_class(specs: Sequence[Spec]) -> str | None:
    for spec in specs:
        for entry in spec.api:
            if entry.kind == "class" and entry.qualname == CONFIG:
                return entry.object
    return None


def sizes(seed: int) -> list[dict[str, Any]]:
    """A small configuration for every probe and a real model's for the outputs, from ``seed``."""
    r = random.Random(seed)
    C = r.choice([32, 48, 64])
    H = r.choice([h for h in (1, 2, 4, 8) if C % h == 0 and (C // h) % 2 == 0])
    T = r.randint(16, 48)
    small = {
        "name": "small",
        "cfg": {
            "V": r.randint(16, 80), "T": T, "C": C, "L": 2, "H": H, "d_ff": r.choice([2, 3, 4]) * C,
            "dropout": r.choice([0.0, 0.1, 0.25]), "rope_theta": r.uniform(100.0, 20000.0),
        },
        "B": r.randint(1, 3), "T": r.randint(1, T), "rows": r.randint(C, 3 * C), "full": True,
    }  # fmt: skip
    real = {
        "name": "real",
        "cfg": {
            "V": r.randint(256, 2048), "T": REAL_T, "C": REAL_C, "L": 1, "H": REAL_H,
            "d_ff": REAL_FF, "dropout": 0.1, "rope_theta": 10000.0,
        },
        "B": 1, "T": r.randint(2, REAL_T), "rows": r.choice([3 * REAL_C, REAL_FF]), "full": False,
    }  # fmt: skip
    return [small, real]


def _where(size: dict[str, Any]) -> str:
    c = size["cfg"]
    return f"C={c['C']}, H={c['H']}, d_ff={c['d_ff']}, B={size['B']}, T={size['T']}"


def _file(specs: Sequence[Spec], module: str | None) -> tuple[str | None, str | None]:
    """The repository path of the stage module that defines a class, and its stage."""
    for spec in specs:
        for rel, path in zip(spec.modules, spec.module_files, strict=True):
            name = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
            if name == module:
                return path, spec.id
    return None, None


def _run(
    box: Sandbox, code: tuple[Path, Path], request: dict[str, Any], scratch: Path, timeout: float
) -> tuple[protocol_run.Answer, protocol_run.Answer, list[str]]:
    """The base's worker and the PR's side by side, then the PR's over the base's weights.

    The PR's first worker measures everything but the outputs on the base's
    weights (its own weights suffice). The base's weights file is checked
    against the digest the base's worker reported (the PR's worker ran beside
    it) and copied into a folder read-only to the second PR worker, which
    loads them and answers at every size. Returns the base's answer, the PR's
    two merged (``merge``), and the files changed under the code or the
    weights while the PR's workers ran.

    Raises:
        ConfigError: the base's worker failed (no verdict).
    """
    src = (workspace.src_roots(code[0]), workspace.src_roots(code[1]))
    full = {**request, "sizes": [s for s in request["sizes"] if s["full"]]}
    before = Snapshot.take(list(code))
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(
            protocol_run.run, box, "base", src[1], request, scratch / "base", timeout
        )
        own = protocol_run.run(box, "head", src[0], full, scratch / "head", timeout)
        base = pending.result()
    if base.problem or base.report.get("fatal"):
        raise ConfigError(
            f"the module protocol's base worker failed: {base.problem or base.report['fatal']}"
        )
    weights = scratch / "given" / "weights.safetensors"
    weights.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(scratch / "base" / "weights.safetensors", weights)
    changed = before.changes(Snapshot.take(list(code)))
    if file_digest(weights) != base.report.get("weights_sha256"):
        changed.append(str(scratch / "base" / "weights.safetensors"))
    confine.add_readonly(box, [weights.parent])
    watched = [weights.parent, *code]
    given = Snapshot.take(watched)
    loading = {
        **request,
        "sizes": [{**s, "full": False} for s in request["sizes"]],
        "given": str(weights),
    }
    loaded = protocol_run.run(box, "head", src[0], loading, scratch / "loaded", timeout)
    changed += given.changes(Snapshot.take(watched))
    return base, merge(own, loaded), sorted(set(changed))


def merge(own: protocol_run.Answer, loaded: protocol_run.Answer) -> protocol_run.Answer:
    """The PR's two answers as one: the first's measurements, the second's loads.

    Per class and size, the loading run's report under the first run's (whose
    figures win, ``load`` excepted); outputs of both (``subject`` and ``trip:*``
    from the first, ``loaded`` from the second); the first problem of either.
    """
    out = protocol_run.Answer("head", seconds=own.seconds + loaded.seconds)
    out.problem = own.problem or loaded.problem
    fatal = own.report.get("fatal") or loaded.report.get("fatal")
    classes: dict[str, dict[str, Any]] = {}
    for label in sorted({*own.report.get("classes", {}), *loaded.report.get("classes", {})}):
        sizes_ = {
            *own.report.get("classes", {}).get(label, {}),
            *loaded.report.get("classes", {}).get(label, {}),
        }
        for size in sizes_:
            mine, theirs = own.probe(label, size) or {}, loaded.probe(label, size) or {}
            joined = {**theirs, **mine}
            if "load" in theirs:
                joined["load"] = theirs["load"]
            classes.setdefault(label, {})[size] = joined
    out.report = {**loaded.report, **own.report, "classes": classes, "fatal": fatal}
    out.outputs = {**own.outputs, **loaded.outputs}
    return out


def declared_breaks(
    repo: GitRepo, base: str, specs: Mapping[str, Spec], limit: int = 500
) -> set[str]:
    """Stages whose spec, at ``base``, promises other numbers than their code computes.

    Walking back from ``base``: a ``Spec: S`` commit with a ``Spec-Break:``
    trailer that changed S's float64 reference (``[oracle].references``), before
    (newer than) any ``Stage: S`` commit, is a numeric break the base's code has
    not met (quant 3.0's bfloat16 activations). A break that left the reference
    as it was (a kit file split, a removed definition) changes no number. The
    oracle and the float64 reference judge those numbers by the new spec; the
    protocol then holds that stage's outputs on the base's weights to bfloat16's
    bound only (``Pair.declared_break``).
    """
    met: set[str] = set()
    broken: set[str] = set()
    for commit, trailers in repo.history_trailers(base, ("Stage", "Spec", "Spec-Break"), limit):
        pending = [s for s in trailers["Spec"] if s in specs and s not in met]
        if trailers["Spec-Break"] and pending:
            changed = repo.changed_in(commit)
            for stage in pending:
                oracle = specs[stage].oracle
                references = set(oracle.references.values()) if oracle else set()
                if references & changed:
                    broken.add(stage)
        met |= set(trailers["Stage"])
    return broken


def judge_protocol(
    ctx: pr_context.PrContext,
    p: plan.Plan,
    box: Sandbox,
    code: tuple[Path, Path],
    scratch: Path,
    say: Callable[[str], None],
    seed: int | None = None,
    timeout: float = 900.0,
) -> Outcome:
    """The ``protocol`` row; ``code`` holds the head's and the base's written sources.

    Raises:
        ConfigError: the base's worker failed (no verdict).
    """
    stage = p.stage.id
    specs = list(ctx.specs.values())
    if not (module_classes(p.closure) or decoders(p.closure, specs)) or config_class(specs) is None:
        return Outcome(stage, CHECK, NOT_RUN, "no stage of the closure exports a class")
    seed = secrets.randbits(63) if seed is None else seed
    request = request_for(list(ctx.specs.values()), p.closure, seed)
    drawn = request["sizes"]
    base, head, changed = _run(box, code, request, scratch, timeout)
    say(f"protocol: base {base.seconds:.1f} s, head {head.seconds:.1f} s, seed {seed:#x}")
    if changed:
        why = f"{changed[0]} changed while the PR's protocol worker ran ({len(changed)} file(s))"
        found = [Violation(SANDBOX_TAMPERED.id, changed[0], None, why, stage, CHECK)]
        return Outcome(stage, CHECK, BROKEN, "the base's weights or code changed", found)
    breaks = declared_breaks(ctx.repo, ctx.base, ctx.specs)
    return decide(p.stage, list(ctx.specs.values()), drawn, base, head, seed, breaks)


def request_for(specs: Sequence[Spec], closure: Sequence[Spec], seed: int) -> dict[str, Any]:
    """A worker's request: the closure's classes at the sizes drawn from ``seed``."""
    return {
        "seed": seed,
        "names": sorted(namespaces({s.id: s for s in specs})),
        "config": config_class(specs),
        "classes": [[c, c] for c in module_classes(closure)],
        "decoders": decoders(closure, specs),
        "sizes": sizes(seed),
        "given": None,
    }


def decide(
    spec: Spec,
    specs: Sequence[Spec],
    drawn: Sequence[dict[str, Any]],
    base: protocol_run.Answer,
    head: protocol_run.Answer,
    seed: int,
    breaks: AbstractSet[str] = frozenset(),
) -> Outcome:
    """The row from both workers' answers (the base's already known to be sound);
    ``breaks``: the stages with a declared break pending (``declared_breaks``)."""
    stage = spec.id
    problem = head.problem or head.report.get("fatal")
    if problem:
        why = f"the PR's code gave no usable answer: {problem} (the base's: {base.seconds:.0f} s)"
        found = [Violation(PROTOCOL_ERROR.id, spec.path, None, why, stage, CHECK)]
        return Outcome(stage, CHECK, BROKEN, "the PR's protocol worker failed", found)
    found = []
    probed = 0
    defined = {**base.report.get("defined", {})}
    for label, by_size in sorted(base.report["classes"].items()):
        path, owner = _file(specs, defined.get(label))
        for size in drawn:
            want = by_size.get(size["name"])
            got = head.probe(label, size["name"])
            if want is None or want.get("build") is not None:
                continue
            probed += 1
            if got is None:
                got = {"build": "the PR's worker did not probe this class"}
            c = size["cfg"]
            pair = Pair(
                label, size["name"], _where(size), got, want, head.outputs, base.outputs,
                stages=8 * (c["L"] + 1) + 4, reduction=max(c["C"], c["d_ff"], size["T"]),
                declared_break=owner in breaks,
            )  # fmt: skip
            for rule, message in judge(pair):
                text = f"{label.rpartition(':')[2]} ({size['name']} size): {message}"
                found.append(Violation(rule, path or spec.path, None, text, stage, CHECK))
    if found:
        summary = f"{len(found)} violation(s) over {probed} probe(s) (seed {seed:#x})"
        return Outcome(stage, CHECK, BROKEN, summary, found[:MAX_ROWS])
    names = ", ".join(sorted({label.rpartition(":")[2] for label in base.report["classes"]}))
    summary = f"{probed} probe(s) keep every module promise: {names} (seed {seed:#x})"
    unjudged = _unjudged(base.report["classes"])
    return Outcome(stage, CHECK, KEPT, summary + (f"; {unjudged}" if unjudged else ""))


def _unjudged(classes: Mapping[str, Mapping[str, Any]]) -> str:
    """What the base's own code could not do, so no promise of it was judged (said in the
    KEPT row rather than passed over): a decoder whose compiled steps raised on the base."""
    said = []
    for label, by_size in sorted(classes.items()):
        for size, found in sorted(by_size.items()):
            decode = found.get("decode") if isinstance(found, Mapping) else None
            if isinstance(decode, Mapping) and "error" in decode:
                name = label.rpartition(":")[2]
                said.append(f"{name} ({size}): the base's compiled steps raised {decode['error']}")
    return "not judged: " + "; ".join(said) if said else ""
