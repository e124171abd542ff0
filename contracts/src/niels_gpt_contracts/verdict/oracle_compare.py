"""Compare the PR's oracle answers with the base's or the reference's (trusted side).

``Judge`` collects violations: ``oracle.differs`` (a call whose answer is
not within ``tolerance``'s bound of the other side's, or raised another
exception type, or returned other outputs), ``oracle.invariant`` (an
invariant the trusted side's driver declared does not hold on the PR's
answers), ``oracle.error`` (the PR's driver run did not finish) and
``runtime.<rule>`` (a watched call dispatched a forbidden op). Messages name
the call, the description of its inputs and the largest deviation; the
reporters escape them.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from niels_gpt_contracts.result import Violation
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.sandbox.oracle_run import Call, Stream
from niels_gpt_contracts.stagespec import Spec
from niels_gpt_contracts.verdict import explain, tolerance
from niels_gpt_contracts.verdict.explain import ORACLE_DIFFERS, ORACLE_INVARIANT

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).


ORACLE_ERROR = Rule(
    "oracle.error",
    "The oracle could not get an answer from the PR's code.",
    "The PR's worker must import every stage of the tree and run every driver to its "
    "end; a crash, a time-out or an unreadable answer is not evidence that the code "
    "is right, so it counts against the PR.",
    "Read the error in the message; import the stage as a user would and run the call.",
)

MAX_PER_STAGE = 3  # violations reported per stage: the first differing calls


class Judge:
    """Collects the violations of one verdict's comparison."""

    def __init__(self, pr_stage: str, check: str, changed: AbstractSet[str] = frozenset()) -> None:
        self.pr_stage = pr_stage
        self.check = check
        self.changed = changed  # the paths the PR changed: a row names the module it edited
        self.found: list[Violation] = []
        self.owners: list[str] = []  # the stage each of ``found`` is about
        self.compared = 0
        self.relations = 0  # invariants checked, each once
        self.checked: set[tuple[str, str, str]] = set()  # (stage, call, relation) checked
        self.refused: set[tuple[str, str]] = set()  # (stage, runtime rule) already reported
        self.failed: list[explain.Failed] = []  # every call that differed, for the reproducer

    def add(self, spec: Spec, rule: str, message: str, *, line: int | None = None) -> None:
        path = spec.path if rule.startswith(("runtime.", ORACLE_ERROR.id)) else self._module(spec)
        self.found.append(
            Violation(rule, path, line, f"{spec.id}: {message}", self.pr_stage, self.check)
        )
        self.owners.append(spec.id)

    def contracts_first(self) -> tuple[list[Violation], list[str]]:
        """``found`` and ``owners`` with each broken promise before the numbers.

        A violated invariant (causality, row independence) or side effect names
        what broke; the differing outputs mostly follow from it, so they come
        after (stable within each kind: the calls' order stays).
        """
        order = sorted(
            range(len(self.found)), key=lambda i: self.found[i].rule == ORACLE_DIFFERS.id
        )
        return [self.found[i] for i in order], [self.owners[i] for i in order]

    def _module(self, spec: Spec) -> str:
        """The stage module a row names: the first the PR changed, else the first that
        holds code rather than re-exports (``__init__.py``), else the first listed."""
        files = spec.module_files
        edited = [f for f in files if f in self.changed]
        named = [f for f in files if not f.endswith("/__init__.py")]
        return (edited or named or list(files))[0]

    def stage(
        self,
        spec: Spec,
        head: Stream,
        ref: Stream,
        *,
        exact: bool,
        what: str,
        skip: AbstractSet[str] = frozenset(),
    ) -> None:
        """Every call of ``spec``'s stage that ``ref`` answered (less those named in
        ``skip``), against ``head``'s answer, then the invariants ``ref``'s driver
        declared, on ``head``'s answers (those an earlier ``stage`` call of this
        judge checked are not checked again)."""
        before = len(self.found)
        if spec.id in head.driver_errors:
            self.add(
                spec,
                ORACLE_ERROR.id,
                f"the oracle driver could not finish on the PR's code: "
                f"{head.driver_errors[spec.id]}",
            )
        for (stage, name), want in ref.calls.items():
            if stage != spec.id or name in skip or len(self.found) - before >= MAX_PER_STAGE:
                continue
            got = head.calls.get((stage, name))
            if got is None:
                if spec.id not in head.driver_errors:
                    self.add(spec, ORACLE_DIFFERS.id, f"call {name} ({want.desc}): no answer")
                continue
            self.compared += 1
            problem = differs_from(got, want, exact=exact)
            if problem:
                self.failed.append(explain.Failed(spec.id, name, want.desc, exact))
                words = explain.differs(name, want.desc, got, want, exact=exact)
                msg = f"{words}: call {name} ({want.desc}) {what}: {problem}"
                self.add(spec, ORACLE_DIFFERS.id, msg)
        # Invariants have their own budget: they say what broke. An invariant is a
        # property of the PR's answers alone; the base's and the reference's streams
        # come from one driver and declare the same ones, so each is checked once.
        before = len(self.found)
        for want in (c for (s, _), c in ref.calls.items() if s == spec.id):
            for relation in want.relations:
                if len(self.found) - before >= MAX_PER_STAGE:
                    break
                key = (spec.id, want.name, json.dumps(relation, sort_keys=True, default=str))
                if key in self.checked:
                    continue
                self.checked.add(key)
                self.relations += 1
                problem = _relation(relation, head, spec.id, want)
                if problem:
                    where = f"call {want.name} ({want.desc})"
                    words = explain.relation(relation)
                    self.add(spec, ORACLE_INVARIANT.id, f"{words}: {where}: {problem}")

    def runtime(self, spec: Spec, head: Stream, ref: Stream) -> None:
        """``spec``'s runtime rules on the ops of ``head``'s calls that ``ref`` marked watched;
        a rule already reported for ``spec`` (from another trusted stream) is not again."""
        for rule in (r for r in spec.rules if r.runtime):
            if (spec.id, rule.rule_id) in self.refused:
                continue
            patterns = list(rule.params["ops"])
            for (stage, name), want in ref.calls.items():
                if stage != spec.id or rule.id not in want.rules:
                    continue
                got = head.calls.get((stage, name))
                if got is None:
                    continue
                ops = head.ops.get(stage, {}).get(name)
                if ops is None:
                    msg = f"call {name}: no ops recorded for this watched call [{rule.message}]"
                    self.add(spec, rule.rule_id, msg, line=rule.line)
                    self.refused.add((spec.id, rule.rule_id))
                    break
                hits = sorted(o for o in ops if any(fnmatch.fnmatchcase(o, p) for p in patterns))
                casts = list(got.casts) if rule.params.get("casts") else []
                if hits or casts:
                    why = ", ".join(hits) if hits else "; ".join(casts[:3])
                    msg = f"dispatched {why} in call {name} ({want.desc}) [{rule.message}]"
                    self.add(spec, rule.rule_id, msg, line=rule.line)
                    self.refused.add((spec.id, rule.rule_id))
                    break


def differs_from(got: Call, want: Call, *, exact: bool) -> str | None:
    """How ``got`` differs from ``want`` beyond the dtype's bound (``exact``: ``want`` is
    a float64 reference's answer), or ``None``."""
    if got.error != want.error:
        if want.error is None:
            return f"raised {got.error} ({got.message[:120]!r}) where the other side returned"
        if got.error is None:
            return f"returned where the other side raised {want.error} ({want.message[:120]!r})"
        return f"raised {got.error} where the other side raised {want.error}"
    if set(got.outputs) != set(want.outputs):
        return f"returned outputs {sorted(got.outputs)} where {sorted(want.outputs)} were expected"
    if got.values != want.values:
        return f"returned {got.values!r} where {want.values!r} was expected"
    for key, w in want.outputs.items():
        if want.compare is not None and key not in want.compare:
            continue
        g = got.outputs[key]
        if g.dtype != w.dtype:
            return f"{key} is {g.dtype} where {w.dtype} was expected"
        dev = tolerance.compare(
            g.data,
            w.data,
            w.dtype,
            stages=want.stages,
            reduction=want.reduction,
            exact_reference=exact,
            computes_in=want.computes_in,
        )
        if dev is not None:
            return f"{key}: {dev.text}"
    return None


def _slice(stream: Stream, stage: str, ref: Any) -> tuple[Any, str] | str:
    if not (isinstance(ref, list) and len(ref) == 3):
        return "a malformed reference"
    call, key, slices = ref
    got = stream.calls.get((stage, str(call)))
    if got is None or str(key) not in got.outputs:
        return f"no output {call}/{key} on the PR's code"
    out = got.outputs[str(key)]
    index: list[slice] = [slice(None)] * out.data.ndim
    for dim, start, stop in slices:
        if not 0 <= int(dim) < out.data.ndim:
            return f"{call}/{key} has {out.data.ndim} dims, the invariant slices dim {dim}"
        index[int(dim)] = slice(int(start), int(stop))
    return out.data[tuple(index)], out.dtype


def _relation(relation: Mapping[str, Any], head: Stream, stage: str, want: Call) -> str | None:
    lhs = _slice(head, stage, relation.get("lhs"))
    if isinstance(lhs, str):
        return lhs
    kind = relation.get("kind")
    if kind in ("upper_zero", "zero"):
        dev = (tolerance.upper_zero if kind == "upper_zero" else tolerance.zero)(lhs[0])
        what = "puts weight above the diagonal" if kind == "upper_zero" else "is not zero"
        a = relation["lhs"]
        return None if dev is None else f"{a[0]}/{a[1]}{a[2]} {what}: {dev.text}"
    rhs = _slice(head, stage, relation.get("rhs"))
    if isinstance(rhs, str):
        return rhs
    dev = tolerance.compare(
        lhs[0],
        rhs[0],
        rhs[1],
        stages=want.stages,
        reduction=want.reduction,
        computes_in=want.computes_in,
    )
    if dev is None:
        return None
    a, b = relation["lhs"], relation["rhs"]
    return f"{a[0]}/{a[1]}{a[2]} != {b[0]}/{b[1]}{b[2]} on the PR's code: {dev.text}"
