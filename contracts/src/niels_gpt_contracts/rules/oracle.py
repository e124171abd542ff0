"""The rule ids of the differential oracle: the PR's code driven through the
public API from a secret seed and compared with the base's code or the
spec's float64 reference (answers, invariants, side effects, cost, memory,
coverage of the declared domain, errors).

``ORACLE`` maps each id to its ``RuleDoc``; ``rules.RULES`` merges it with
the other families.
"""

from __future__ import annotations

from niels_gpt_contracts.rules.doc import RuleDoc

ORACLE: dict[str, RuleDoc] = {
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
