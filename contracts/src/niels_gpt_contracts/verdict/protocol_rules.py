"""The module protocol's rules: what every ``nn.Module`` promises, judged against the base.

Each rule is one ``ProtocolRule`` object: its ``Rule`` (id and documentation,
registered) and its check together; ``RULES`` lists them in the order a verdict
reads them (the broken promise before the numbers that follow from it). A check
takes one class at one size (``Pair``: the PR's and the base's reports and
outputs, ``sandbox._protocol_probes``) and returns what it found in words; an
empty list is KEPT. Adding a promise is adding one object here and the
measurement it reads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from niels_gpt_contracts.rules import Rule
from niels_gpt_contracts.sandbox.oracle_run import Output
from niels_gpt_contracts.verdict import tolerance

SIGMAS = 6.0  # an init statistic may stray this many standard errors from the base's


@dataclass(frozen=True)
class Pair:
    """One class at one size: the PR's and the base's reports and outputs."""

    label: str
    size: str
    where: str  # the size in words, e.g. "C=32, T=7"
    head: dict[str, Any]
    base: dict[str, Any]
    head_out: dict[str, Output]
    base_out: dict[str, Output]
    stages: int  # rounding stages a forward of this class chains (tolerance)
    reduction: int  # the longest sum in it (tolerance)
    # The class's stage has a declared break pending (``protocol.declared_breaks``): its
    # numbers are the oracle's to judge by the new spec, and the outputs on the base's
    # weights need only agree within bfloat16's bound (a gross error still shows).
    declared_break: bool = False

    def outputs(self, side: dict[str, Output], what: str) -> dict[str, Output]:
        prefix = f"{self.label}|{self.size}|{what}|"
        return {k[len(prefix) :]: v for k, v in side.items() if k.startswith(prefix)}


@dataclass(frozen=True)
class ProtocolRule:
    """One promise: its rule (id and what SARIF shows of it) and its check."""

    rule: Rule
    check: Callable[[Pair], list[str]]

    @property
    def id(self) -> str:
        return self.rule.id


def _differ(
    pair: Pair, got: dict[str, Output], want: dict[str, Output], loose: bool = False
) -> Iterator[str]:
    """Each output of ``got`` beyond the dtype's bound of ``want``'s; ``loose``: bfloat16's
    bound for float outputs (a declared break)."""
    if sorted(got) != sorted(want):
        yield f"outputs {sorted(got)} where {sorted(want)} were expected"
        return
    for key in sorted(want):
        w, g = want[key], got[key]
        if g.dtype != w.dtype:
            yield f"{key} is {g.dtype} where {w.dtype} was expected"
            continue
        if loose and w.dtype in ("float32", "float64"):
            found = tolerance.compare(g.data, w.data, "bfloat16", stages=2, reduction=1)
        else:
            found = tolerance.compare(
                g.data, w.data, w.dtype, stages=pair.stages, reduction=pair.reduction
            )
        if found is not None:
            yield f"{key}: {found.text}"


def _build(p: Pair) -> list[str]:
    if p.head.get("build") is not None:
        return [f"building it at {p.where} raised: {p.head['build']}"]
    if p.head.get("load") is not None:  # the load row says why nothing was called
        return []
    if p.base.get("input") is not None and p.head.get("input") != p.base.get("input"):
        errors = "; ".join(p.head.get("input_errors", [])) or "another input"
        return [f"a forward on {p.base['input']} raised, where the base's answered ({errors})"]
    return []


def _schema(p: Pair) -> list[str]:
    if "schema" not in p.head:
        return []
    out = []
    head, base = p.head["schema"], p.base["schema"]
    missing, extra = sorted(set(base) - set(head)), sorted(set(head) - set(base))
    if missing:
        out.append(f"state_dict lacks {missing[:5]} (old checkpoints cannot load)")
    if extra:
        out.append(f"state_dict has keys the base's has not: {extra[:5]}")
    for key in sorted(set(head) & set(base)):
        if head[key] != base[key]:
            out.append(f"state_dict[{key!r}] is {head[key]} where the base's is {base[key]}")
    for kind in ("persistent", "nonpersistent"):
        if p.head.get(kind) != p.base.get(kind):
            out.append(f"{kind} buffers {p.head.get(kind)} where the base's are {p.base.get(kind)}")
    return out


def _hooks(p: Pair) -> list[str]:
    head, base = p.head.get("hooks"), p.base.get("hooks")
    if not isinstance(base, dict):
        return []
    if not isinstance(head, dict):
        return [f"a forward and backward with hooks on every submodule raised: {head}"]
    out = []
    for name, counts in sorted(base.items()):
        got = head.get(name)
        if got != counts:
            out.append(
                f"{name}: forward pre-hooks and hooks fired {got} times where the base's "
                f"fired {counts} (over one forward and one backward)"
            )
    return out[:5]


def _init(p: Pair) -> list[str]:
    head, base = p.head.get("init"), p.base.get("init")
    if not isinstance(head, dict) or not isinstance(base, dict):
        return []
    out = []
    for name, b in sorted(base["params"].items()):
        h = head["params"].get(name)
        if h is None:
            continue
        if b["seeded"] and not h["seeded"]:
            out.append(f"{name} is the same under two seeds (the seed no longer changes it)")
        sigma = max(b["std"], h["std"])
        n = max(1, b["n"])
        mean_bound = SIGMAS * sigma * math.sqrt(2 / n) + 1e-9 * abs(b["mean"]) + 1e-12
        std_bound = SIGMAS * sigma * math.sqrt(1 / n) + 1e-12
        if abs(h["mean"] - b["mean"]) > mean_bound:
            out.append(
                f"{name} starts with mean {h['mean']:.4g} where the base's is {b['mean']:.4g} "
                f"(bound {mean_bound:.3g} for {n} values)"
            )
        if abs(h["std"] - b["std"]) > std_bound:
            out.append(
                f"{name} starts with std {h['std']:.4g} where the base's is {b['std']:.4g} "
                f"(bound {std_bound:.3g} for {n} values)"
            )
    before = {tuple(x) for x in base["equal"]}
    for a, b2 in head["equal"]:
        if (a, b2) not in before:
            out.append(f"{a} and {b2} start equal, where the base's start different")
    return out[:8]


def _state(p: Pair) -> list[str]:
    head, base = p.head.get("state", {}), p.base.get("state", {})
    out = []
    for step, names in sorted(head.items()):
        new = [n for n in names if n not in base.get(step, [])]
        if new:
            out.append(f"the {step} step left {new[:4]} changed, where the base's left them")
    return out


def _memory(p: Pair) -> list[str]:
    head, base = p.head.get("memory"), p.base.get("memory")
    if not isinstance(base, dict):
        return []
    if not isinstance(head, dict):
        return [f"the memory probe's calls raised: {head}"]
    out = []
    for when, want in sorted(base.items()):
        got = head.get(when, 0)
        if got > want:
            after = "a backward" if when == "backward" else f"{when} call(s)"
            out.append(f"holds {got} bytes of tensors after {after} where the base's holds {want}")
    return out


def _compile(p: Pair) -> list[str]:
    head, base = p.head.get("compile"), p.base.get("compile")
    if not isinstance(head, dict) or not isinstance(base, dict) or "error" in base:
        return []
    if "error" in head:
        return [f"torch.compile of the forward raised: {head['error']}"]
    out = []
    if head["breaks"] > base["breaks"] or head["graphs"] > base["graphs"]:
        why = "; ".join(head.get("reasons", [])) or "no reason recorded"
        out.append(
            f"torch.compile makes {head['graphs']} graph(s) with {head['breaks']} break(s) where "
            f"the base's makes {base['graphs']} with {base['breaks']} ({why})"
        )
    again, was = head["frames"] - head["graphs"], base["frames"] - base["graphs"]
    if again > was:
        out.append(f"two more same-shaped calls recompile {again} frame(s) where the base's {was}")
    return out


def _decode(p: Pair) -> list[str]:
    """A decoder's compiled steps (``_protocol_probes.decode_probe``) against the base's."""
    head, base = p.head.get("decode"), p.base.get("decode")
    if not isinstance(base, dict) or "error" in base:
        return []
    if not isinstance(head, dict):
        return ["the decoder was not probed with compile_step"]
    if "error" in head:
        return [f"generating with compiled steps raised: {head['error']}"]
    out = []
    if base["graphs"] > 0 and head["graphs"] == 0:
        out.append("compile_step compiled nothing: the steps ran eagerly")
    elif head["graphs"] > base["graphs"]:
        out.append(
            f"one call's compiled steps made {head['graphs']} graph(s) where the base's "
            f"made {base['graphs']} (a step that recompiles, or breaks its graph)"
        )
    again, was = head["frames"] - head["graphs"], base["frames"] - base["graphs"]
    if again > was:
        out.append(f"a second same-shaped call compiled {again} graph(s) more, the base's {was}")
    eager, compiled = p.outputs(p.head_out, "eager"), p.outputs(p.head_out, "compiled")
    for diff in _differ(p, compiled, eager):
        out.append(f"the compiled steps choose other ids than the eager ones: {diff}")
    return out


def _trips(p: Pair) -> list[str]:
    head, base = p.head.get("trips"), p.base.get("trips")
    if not isinstance(head, dict) or not isinstance(base, dict):
        return []
    own = p.outputs(p.head_out, "subject")
    out = []
    for trip, error in sorted(head.items()):
        if base.get(trip) is None and error is not None:
            out.append(f"{trip} of the module raised: {error}")
        elif error is None:
            for diff in _differ(p, p.outputs(p.head_out, f"trip:{trip}"), own):
                out.append(f"after {trip}, the module answers otherwise: {diff}")
    return out


def _load(p: Pair) -> list[str]:
    if p.head.get("load") is not None:
        return [f"the base's state_dict does not load strictly: {p.head['load']}"]
    if p.base.get("input") is None:
        return []
    got, want = p.outputs(p.head_out, "loaded"), p.outputs(p.base_out, "subject")
    return [
        f"with the base's weights at {p.where}, {diff} (the base's answer)"
        for diff in _differ(p, got, want, loose=p.declared_break)
    ][:3]


PROTOCOL_ERROR = Rule(
    "protocol.error",
    "The PR's module-protocol worker gave no usable answer.",
    "The worker imports the PR's tree and probes every module class; a crash, a "
    "timeout or a malformed report is no evidence the promises hold.",
    "Make the package importable and its modules buildable in a plain process.",
)  # emitted by the phase (``verdict.protocol``), not per class

RULES: tuple[ProtocolRule, ...] = (
    ProtocolRule(
        Rule(
            "protocol.build",
            "A module class no longer builds or answers the input the base's answered.",
            "Every nn.Module class a stage exports is built from a configuration drawn by "
            "the verdict and called with the first input kind the base's class answers.",
            "Keep the constructor and forward accepting what the base's accepted.",
        ),
        _build,
    ),
    ProtocolRule(
        Rule(
            "protocol.state-dict",
            "A state_dict's keys, shapes, dtypes or persistence differ from the base's.",
            "Checkpoints are state_dicts: a renamed, reshaped or newly persistent entry "
            "breaks every saved model. Change them only through a spec amendment.",
            "Keep the state_dict as the base's has it.",
        ),
        _schema,
    ),
    ProtocolRule(
        Rule(
            "protocol.hooks",
            "Forward hooks on a submodule fire otherwise than on the base.",
            "Activation capture, pruning and FSDP's unshard hooks rely on each submodule "
            "being called; work computed without calling a submodule skips its hooks.",
            "Call the submodules rather than their weights.",
        ),
        _hooks,
    ),
    ProtocolRule(
        Rule(
            "protocol.init",
            "Init ignores the caller's seed, changes its statistics, or ties blocks.",
            "Two seeds must give different parameters where the base's do; each parameter's "
            "mean and std agree with the base's within six standard errors of its size; no "
            "two parameters start equal where the base's start different.",
            "Draw from the global generator as the base does, without reseeding it.",
        ),
        _init,
    ),
    ProtocolRule(
        Rule(
            "protocol.process-state",
            "A step of a module's life leaves global torch state changed.",
            "Compiler stance and configs, backend flags, every torch get_/is_ state, RNG, "
            "global hooks, mode stacks and the environment are compared before and after each "
            "step with what the base's step changed.",
            "Restore every global a call sets, or do not set it.",
        ),
        _state,
    ),
    ProtocolRule(
        Rule(
            "protocol.memory",
            "A module holds more tensor bytes after its calls than the base's.",
            "Bytes of live tensor storage after 1 and 20 calls and after a backward, outputs "
            "released, for every module class, cached or not.",
            "Release what a call computed; keep no copies of the weights.",
        ),
        _memory,
    ),
    ProtocolRule(
        Rule(
            "protocol.compile",
            "torch.compile of a module breaks its graph or recompiles more than the base's.",
            "Graph breaks (a tensor read in Python, say) cost a host sync each call and make "
            "fullgraph compilation raise; a recompile per call makes compilation useless.",
            "Keep the forward traceable as the base's is.",
        ),
        _compile,
    ),
    ProtocolRule(
        Rule(
            "protocol.decode-compile",
            "A decoder's compiled steps compile more graphs than the base's, or none.",
            "A function that takes compile_step (kv_cache's generate) promises one traced "
            "step reused token after token: greedy ids with the steps compiled by a counting "
            "backend must equal its eager ids, with no more graphs and no more recompiles "
            "on a second call than the base's make.",
            "Keep the decode step's inputs shaped and typed the same at every position.",
        ),
        _decode,
    ),
    ProtocolRule(
        Rule(
            "protocol.round-trip",
            "A module no longer pickles, saves or deep-copies, or answers otherwise after.",
            "torch.save of a whole model, pickle, multiprocessing's spawn and copy.deepcopy "
            "(before and after a grad-enabled forward) must work as on the base and keep the "
            "outputs.",
            "Keep modules free of local functions, open handles and graph-holding tensors.",
        ),
        _trips,
    ),
    ProtocolRule(
        Rule(
            "protocol.load",
            "The base's state_dict does not load into the PR's module, or answers otherwise.",
            "Old checkpoints must keep working: the base's weights load strictly and give the "
            "base's outputs within the dtype's bound, at a small size and at a real model's "
            "(C = 768, rows of 2304 or 3072, T up to 1024).",
            "Compute what the base computes from the same weights, at every size.",
        ),
        _load,
    ),
)


def judge(pair: Pair) -> Iterator[tuple[str, str]]:
    """Every ``(rule id, message)`` one class at one size breaks, in ``RULES``' order."""
    for rule in RULES:
        for message in rule.check(pair):
            yield rule.id, message
