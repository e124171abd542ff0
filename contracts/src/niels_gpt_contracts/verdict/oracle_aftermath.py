"""What the PR's calls left behind and cost, against the base's same calls (trusted side).

The workers report, with each call, what it left behind and what it cost
(``sandbox/_oracle_aftermath.py``), and for each ``Oracle.held`` the bytes of
storage a driver's objects keep alive. The base's figures are the standard
(never the float64 reference's, another implementation). Violations:

- ``oracle.side-effect``: the call changed an input tensor in place, or an
  output of one of the two previous calls, that the base leaves unchanged;
  or it left the global state (grad or inference mode, default dtype, thread
  count, deterministic algorithms, CPU autocast, the global CPU generator)
  otherwise than the base's call does; or the PR's worker did not report;
- ``oracle.memory``: a held figure over ``MEMORY_RATIO`` times the base's;
- ``oracle.cost``: FLOPs or dispatched ATen ops over ``COST_RATIO`` times
  the base's, plus a small absolute slack for tiny calls.

The PR's reports are untrusted: anything malformed is a violation.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import Annotated, Any

import msgspec

from niels_gpt_contracts.decoding import Malformed, convert
from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.sandbox.oracle_run import Stream
from niels_gpt_contracts.stagespec import Spec
from niels_gpt_contracts.verdict.oracle_compare import Judge

# The rules this module emits, each with what SARIF shows of it; defining one
# registers it (``rules.registry``).
ORACLE_SIDE_EFFECT = Rule(
    "oracle.side-effect",
    "A call left something behind that the base's call does not.",
    "What a call leaves is part of its result: its inputs unchanged, the outputs of "
    "earlier calls unchanged by later ones (no aliasing), and the global state after it "
    "(grad and inference mode, default dtype, threads, deterministic flag, autocast, "
    "whether it drew from the global generator) as the base leaves it.",
    "Return fresh tensors, leave arguments and global state alone, draw as the base does.",
)

ORACLE_COST = Rule(
    "oracle.cost",
    "A call dispatches far more work than the base's.",
    "The worker counts the ATen ops and FLOPs of calls drawn from the secret seed; more "
    "than 1.5 times the base's (plus a small slack) refuses a slower stage without any "
    "wall clock, so neither a busy machine nor a fast one decides it.",
    "Count the call's ops (a TorchDispatchMode or FlopCounterMode) and remove the extra.",
)

ORACLE_MEMORY = Rule(
    "oracle.memory",
    "A stage's modules or caches hold far more memory than the base's.",
    "Drivers report the bytes of the storages a module or cache keeps alive "
    "(o.held); more than 1.25 times the base's is refused.",
    "Allocate what is used; keep no copies alive after the call.",
)

MAX_PER_RULE = 2  # violations reported per stage and rule
COST_RATIO, OPS_SLACK, FLOPS_SLACK = 1.5, 16, 4096
MEMORY_RATIO, MEMORY_SLACK = 1.25, 4096
STATE = {
    "grad": "grad mode",
    "inference": "inference mode",
    "dtype": "the default dtype",
    "threads": "the thread count unchanged",
    "deterministic": "the deterministic-algorithms flag",
    "autocast": "CPU autocast (enabled, dtype)",
}
SIDE, MEMORY, COST = ORACLE_SIDE_EFFECT.id, ORACLE_MEMORY.id, ORACLE_COST.id


Count = Annotated[int, msgspec.Meta(ge=0)]


class Inputs(msgspec.Struct, frozen=True):
    """The call's argument tensors the worker could hash, and those it changed."""

    checked: list[str]
    changed: list[str]


class CallState(msgspec.Struct, frozen=True):
    """The global state after the call (``sandbox._oracle_aftermath.state``); a key
    the worker did not send compares as None."""

    grad: bool | None = None
    inference: bool | None = None
    dtype: str | None = None
    threads: bool | None = None
    deterministic: bool | None = None
    autocast: list[bool | str] | None = None
    rng: str | None = None
    rng_moved: bool | None = None
    globals: list[str] | None = None  # counted calls only


class After(msgspec.Struct, frozen=True):
    """What one call left behind, as a worker reports it (a call frame's ``after``)."""

    inputs: Inputs
    clobbered: list[str]
    state: CallState
    ops: Count | None = None
    flops: Count | None = None


def stage(j: Judge, spec: Spec, head: Stream, base: Stream) -> None:
    """Every call and held figure of ``spec``'s stage the base reported, against the head's."""
    counts: Counter[str] = Counter()

    def add(rule: str, message: str) -> None:
        if counts[rule] < MAX_PER_RULE:
            counts[rule] += 1
            j.add(spec, rule, message)

    for (st, name), want in base.calls.items():
        got = head.calls.get((st, name))
        if st != spec.id or want.after is None or got is None:
            continue  # a missing answer is oracle.differs' to report
        try:
            problems = compare(got.after, want.after)
        except Malformed:
            problems = [(SIDE, "the PR's worker sent a malformed report of what the call left")]
        for rule, problem in problems:
            add(rule, f"call {name} ({want.desc}): {problem}")
    for (st, name), w in base.held.items():
        if st != spec.id:
            continue
        g = head.held.get((st, name))
        if g is None:
            add(MEMORY, f"held {name} ({w.desc}): no figure on the PR's code")
        elif g.bytes > MEMORY_RATIO * w.bytes + MEMORY_SLACK:
            add(
                MEMORY,
                f"held {name} ({w.desc}): {g.bytes} bytes of storage kept alive where the "
                f"base keeps {w.bytes} (over {MEMORY_RATIO:g}x)",
            )


def _plain(name: str) -> str:
    """A name from the PR's report, short and printable."""
    return "".join(c if c.isprintable() else "?" for c in name[:80])


def _after(report: Any) -> After:
    if not isinstance(report, Mapping):
        raise Malformed("no report")
    return convert(report, After, "a call's aftermath")


def compare(got: Any, want: Any) -> list[tuple[str, str]]:
    """(rule, text) for each way ``got`` (the PR's report) departs from ``want`` (the base's).

    Raises:
        Malformed: either report does not decode as an ``After``.
    """
    g, w = _after(got), _after(want)
    out: list[tuple[str, str]] = []
    for name in sorted(set(g.inputs.changed) - set(w.inputs.changed)):
        if name in w.inputs.checked or ":" not in name:  # module state new to the PR: its own
            out.append(
                (SIDE, f"changed its input {_plain(name)} in place; the base's call does not")
            )
    for ref in sorted(set(g.clobbered) - set(w.clobbered)):
        why = "an output of an earlier call, which the base's call leaves as it was"
        out.append((SIDE, f"changed {_plain(ref)}, {why}"))
    for key, label in STATE.items():
        g_value, w_value = getattr(g.state, key), getattr(w.state, key)
        if g_value != w_value:
            g_text, w_text = repr(g_value)[:40], repr(w_value)[:40]
            out.append(
                (SIDE, f"left {label} at {_plain(g_text)} where the base's call leaves {w_text}")
            )
    # Every other torch global, on the counted calls both sides counted (the same
    # calls: the share is keyed by the seed): one the PR's call left changed and the
    # base's did not (a compiler stance or config, a backend flag, a global hook).
    if w.state.globals is not None:
        if g.state.globals is None:
            raise Malformed("expected the names of the globals a counted call changed")
        new = sorted(set(g.state.globals) - set(w.state.globals))
        if new:
            names = ", ".join(_plain(k) for k in new[:4])
            out.append((SIDE, f"left {names} changed, where the base's call leaves them"))
    # Whether the call drew from the global generator at all, not how much: an honest
    # re-blocking of dropout (another QUERY_BLOCK) draws a seed per block and so moves
    # the generator by another amount (test_a_faster_but_equal_attention_is_kept).
    if g.state.rng_moved != w.state.rng_moved:
        did = {True: "drew from", False: "did not draw from"}
        g_did, w_did = did[bool(g.state.rng_moved)], did[bool(w.state.rng_moved)]
        why = f"it {g_did} the global generator where the base's call {w_did} it"
        out.append((SIDE, f"the call consumed the global RNG differently from the base: {why}"))
    costs = (("ops", "dispatched ATen ops", OPS_SLACK), ("flops", "FLOPs", FLOPS_SLACK))
    for key, what, slack in costs:
        w_n, g_n = getattr(w, key), getattr(g, key)
        if w_n is None:
            continue
        if g_n is None:
            raise Malformed(f"no {key} count")
        if g_n > COST_RATIO * w_n + slack:
            why = f"{g_n} {what} where the base's call needs {w_n} (over {COST_RATIO:g}x)"
            out.append((COST, why))
    return out
