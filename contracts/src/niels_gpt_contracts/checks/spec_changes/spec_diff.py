"""What an amendment changes in a stage's contract: the base and head specs compared.

Each difference is a ``Change`` of one of three levels:

- ``BREAKING``: a user or a later PR may be hurt: a removed or renamed export,
  object, parameter, method, field, invariant, rule or mutant; a changed
  default, annotation, return, kind or invariant text; a new parameter that is
  positional or has no default; a loosened rule (fewer forbidden names or ops,
  more allowed dependencies, fewer files under a rule); a wider ``may_change``
  or a narrower ``must_not_change``; a new dependency.
- ``ADDITIVE``: new keyword-only parameters with defaults, new exports,
  objects, methods and fields, new invariants, rules and mutants, tighter
  rules, a narrower ``may_change``, a wider ``must_not_change``, owned modules
  added or moved, an ``[oracle]`` table, float64 reference or reference call
  added.
- ``KEPT``: nothing in the contract moves: a title, a seed, a rule's message,
  a re-targeted mutant patch (same id and bug), the spec kit modules the
  oracle table declares (what the kit files hold is judged as evidence,
  ``checks.context.speckit``), comments (TOML comments never reach the parsed data).

The spec's data is compared, not its text; ``schema_version`` and ``version``
are the caller's business. Anything this module does not know how to judge is
BREAKING: an unknown change must be declared, never waved through.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from niels_gpt_contracts.checks.public_api.signatures import parse_signature

Level = Literal["KEPT", "ADDITIVE", "BREAKING"]
LEVELS: tuple[Level, ...] = ("KEPT", "ADDITIVE", "BREAKING")

# Keys that describe and never bind: a change to them is KEPT.
_DESCRIPTIVE = frozenset({"title", "seed", "message", "description"})
# Rule keys whose list, grown, makes the rule stricter (shrunk: looser).
_STRICTER_WHEN_LONGER = frozenset(
    {"files", "names", "ops", "attributes", "require_call", "methods", "functions"}
)


@dataclass(frozen=True)
class Change:
    """One difference between the base's and the head's spec."""

    level: Level
    what: str


def worst(changes: Iterable[Change]) -> Level:
    """The highest level among ``changes``; ``KEPT`` for none."""
    found = {c.level for c in changes}
    return next((lv for lv in reversed(LEVELS) if lv in found), "KEPT")


def _sets(
    base: Iterable[str], head: Iterable[str], what: str, grown: Level, shrunk: Level
) -> list[Change]:
    """Items added (``grown``) and removed (``shrunk``) between two collections."""
    b, h = set(base), set(head)
    out = [Change(grown, f"{what} +{x}") for x in sorted(h - b)]
    return out + [Change(shrunk, f"{what} -{x}") for x in sorted(b - h)]


def _by_id(items: Iterable[Mapping[str, Any]], key: str = "id") -> dict[str, Mapping[str, Any]]:
    return {str(item[key]): item for item in items}


def _signature(where: str, base: str, head: str) -> list[Change]:
    """A function's or method's signature, parameter by parameter."""
    if base == head:
        return []
    b, h = parse_signature(base), parse_signature(head)
    bp, hp = {p[0]: p for p in b["params"]}, {p[0]: p for p in h["params"]}
    out: list[Change] = []
    for name in bp:
        if name not in hp:
            out.append(Change("BREAKING", f"{where}: parameter {name!r} removed or renamed"))
        elif bp[name] != hp[name]:
            out.append(
                Change(
                    "BREAKING", f"{where}: parameter {name!r} changed (kind, default or annotation)"
                )
            )
    kept = [p[0] for p in b["params"] if p[0] in hp]
    if kept != [p[0] for p in h["params"] if p[0] in bp]:
        out.append(Change("BREAKING", f"{where}: parameters reordered"))
    for name, param in hp.items():
        if name in bp:
            continue
        keyword_with_default = param[1] == "KEYWORD_ONLY" and param[2] is not None
        if keyword_with_default or param[1] == "VAR_KEYWORD":
            out.append(Change("ADDITIVE", f"{where}: +keyword {name}"))
        else:
            out.append(Change("BREAKING", f"{where}: +{name}, positional or without a default"))
    init = where.endswith(".__init__")  # no annotation on __init__ means -> None
    if (b["return"] or ("None" if init else None)) != (h["return"] or ("None" if init else None)):
        out.append(Change("BREAKING", f"{where}: return changed"))
    return out


def _api_entry(obj: str, base: Mapping[str, Any], head: Mapping[str, Any]) -> list[Change]:
    if base.get("kind") != head.get("kind"):
        return [Change("BREAKING", f"api {obj}: kind changed")]
    out = _sets(
        base.get("exports", []), head.get("exports", []), f"{obj} export", "ADDITIVE", "BREAKING"
    )
    if "signature" in base or "signature" in head:
        out += _signature(obj, str(base.get("signature", "()")), str(head.get("signature", "()")))
    bm, hm = dict(base.get("methods", {})), dict(head.get("methods", {}))
    out += _sets(bm, hm, f"{obj} method", "ADDITIVE", "BREAKING")
    for name in sorted(set(bm) & set(hm)):
        out += _signature(f"{obj}.{name}", bm[name], hm[name])
    bf, hf = dict(base.get("fields", {})), dict(head.get("fields", {}))
    out += _sets(bf, hf, f"{obj} field", "ADDITIVE", "BREAKING")
    out += [
        Change("BREAKING", f"{obj} field {n} retyped")
        for n in sorted(set(bf) & set(hf))
        if bf[n] != hf[n]
    ]
    if base.get("same_as") != head.get("same_as"):
        level: Level = "ADDITIVE" if base.get("same_as") is None else "BREAKING"
        out.append(Change(level, f"{obj} same_as {head.get('same_as')}"))
    return out


def _rule(rid: str, base: Mapping[str, Any], head: Mapping[str, Any]) -> list[Change]:
    where = f"rule {rid}"
    if base.get("kind") != head.get("kind"):
        return [Change("BREAKING", f"{where}: kind changed")]
    out: list[Change] = []
    for key in sorted((set(base) | set(head)) - {"id", "kind"} - _DESCRIPTIVE):
        b, h = base.get(key), head.get(key)
        if b == h:
            continue
        if key in _STRICTER_WHEN_LONGER:
            out += _sets(b or [], h or [], f"{where} {key}", "ADDITIVE", "BREAKING")
        elif key == "allowed":  # dependencies: more allowed is looser
            out += _sets(b or [], h or [], f"{where} {key}", "BREAKING", "ADDITIVE")
        elif key in ("casts", "follow_local_calls", "tests"):  # switched on: stricter
            out.append(Change("ADDITIVE" if h and not b else "BREAKING", f"{where}: {key} {h}"))
        else:  # driver, module, function, pyproject: what the rule is about moved
            out.append(Change("BREAKING", f"{where}: {key} changed"))
    return out


def _keyed(
    kind: str,
    base: Mapping[str, Mapping[str, Any]],
    head: Mapping[str, Mapping[str, Any]],
    each: Callable[[str, Mapping[str, Any], Mapping[str, Any]], list[Change]],
) -> list[Change]:
    out = _sets(base, head, kind, "ADDITIVE", "BREAKING")
    for key in sorted(set(base) & set(head)):
        out += each(key, base[key], head[key])
    return out


def _invariant(iid: str, base: Mapping[str, Any], head: Mapping[str, Any]) -> list[Change]:
    return [Change("BREAKING", f"invariant {iid}: text changed")] if base != head else []


def _mutant(mid: str, base: Mapping[str, Any], head: Mapping[str, Any]) -> list[Change]:
    if base.get("text") != head.get("text"):
        return [Change("BREAKING", f"mutant {mid}: the bug it stands for changed")]
    out: list[Change] = []
    patch = ("file", "find", "replace", "occurrence")
    if any(base.get(k) != head.get(k) for k in patch):
        out.append(Change("KEPT", f"mutant {mid}: re-targeted"))
    if base.get("retarget") != head.get("retarget"):
        out.append(
            Change("KEPT", f"mutant {mid}: retarget {'set' if head.get('retarget') else 'cleared'}")
        )
    unknown = (set(base) | set(head)) - {"id", "text", "seed", "retarget", *patch}
    out += [
        Change("BREAKING", f"mutant {mid}: {k} changed")
        for k in sorted(unknown)
        if base.get(k) != head.get(k)
    ]
    return out


def _paths(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[Change]:
    out = _sets(
        base.get("may_change", []), head.get("may_change", []), "may_change", "BREAKING", "ADDITIVE"
    )
    out += _sets(
        base.get("must_not_change", []),
        head.get("must_not_change", []),
        "must_not_change",
        "ADDITIVE",
        "BREAKING",
    )
    out += _sets(
        base.get("device_branches", []),
        head.get("device_branches", []),
        "device_branches",
        "BREAKING",
        "ADDITIVE",
    )
    bl, hl = _by_id(base.get("line_scoped", [])), _by_id(head.get("line_scoped", []))
    out += _sets(bl, hl, "line_scoped", "BREAKING", "ADDITIVE")
    out += [
        Change("BREAKING", f"line_scoped {k} changed")
        for k in sorted(set(bl) & set(hl))
        if bl[k] != hl[k]
    ]
    return out


def _oracle(base: Mapping[str, Any] | None, head: Mapping[str, Any] | None) -> list[Change]:
    """The ``[oracle]`` table: an oracle, a reference or a reference call added is more
    evidence (ADDITIVE); one removed, or the driver or a reference moved, is BREAKING."""
    if base == head:
        return []
    if base is None:
        return [Change("ADDITIVE", "oracle added")]
    if head is None:
        return [Change("BREAKING", "oracle removed")]
    out: list[Change] = []
    if base.get("driver") != head.get("driver"):
        out.append(Change("BREAKING", "oracle driver changed"))
    br, hr = dict(base.get("references", {})), dict(head.get("references", {}))
    out += _sets(br, hr, "oracle reference", "ADDITIVE", "BREAKING")
    moved = sorted(m for m in set(br) & set(hr) if br[m] != hr[m])
    out += [Change("BREAKING", f"oracle reference {m} moved") for m in moved]
    out += _sets(
        base.get("reference_calls", []),
        head.get("reference_calls", []),
        "oracle reference_calls",
        "ADDITIVE",
        "BREAKING",
    )
    out += _sets(base.get("axes", []), head.get("axes", []), "oracle axis", "ADDITIVE", "BREAKING")
    if base.get("kit", []) != head.get("kit", []):
        out.append(Change("KEPT", "oracle kit declaration changed"))
    return out


def classify(base: Mapping[str, Any], head: Mapping[str, Any]) -> list[Change]:
    """Every contract difference between two parsed, valid specs of one stage."""
    out: list[Change] = []
    for key in ("id", "package", "distribution"):
        if base.get(key) != head.get(key):
            out.append(Change("BREAKING", f"{key} changed"))
    out += [
        Change("KEPT", f"{k} reworded") for k in ("title", "seed") if base.get(k) != head.get(k)
    ]
    out += _sets(
        base.get("depends_on", []), head.get("depends_on", []), "depends_on", "BREAKING", "ADDITIVE"
    )
    out += _sets(base.get("modules", []), head.get("modules", []), "module", "ADDITIVE", "ADDITIVE")
    out += _paths(base.get("paths", {}), head.get("paths", {}))
    out += _keyed(
        "api",
        _by_id(base.get("api", []), "object"),
        _by_id(head.get("api", []), "object"),
        _api_entry,
    )
    out += _keyed("rule", _by_id(base.get("rules", [])), _by_id(head.get("rules", [])), _rule)
    out += _keyed(
        "invariant",
        _by_id(base.get("invariants", [])),
        _by_id(head.get("invariants", [])),
        _invariant,
    )
    out += _keyed(
        "mutant", _by_id(base.get("mutants", [])), _by_id(head.get("mutants", [])), _mutant
    )
    out += _oracle(base.get("oracle"), head.get("oracle"))
    known = {"schema_version", "version", "id", "package", "distribution", "title", "seed"}
    known |= {"depends_on", "modules", "paths", "api", "rules", "invariants", "mutants", "oracle"}
    for key in sorted((set(base) | set(head)) - known):
        if base.get(key) != head.get(key):
            out.append(Change("BREAKING", f"{key} changed"))
    return out
