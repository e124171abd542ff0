"""Tool: dump every oracle call of every stage, and compare two dumps.

    python contracts/benchmarks/oracle_dump.py dump --root TREE --seed 7 --out before.json
    python contracts/benchmarks/oracle_dump.py compare before.json after.json

``dump`` runs the oracle drivers of ``TREE`` (a checkout: its ``specs/`` and
``packages/*/src``) once, in one worker started by the checker's own launcher
(``sandbox.oracle_run``, as the base's side of a verdict: one thread, every
call, no ops recorded), with each call's recipe captured before it runs
(``_oracle_capture``). It writes, per stage and call: the header fields (desc,
axes, stages, reduction, rules, relations, compare, computes_in), the error
raised if any, and the dtype, shape and sha256 of the bytes of every output
tensor and of every captured argument and weight. Draws are keyed by the
seed and each call's tag, so two trees that build a call from the same tags
give it the same inputs whatever order they run it in.

``compare`` prints, per stage: the calls before and after, how many answer the
same (every output hash and the error the same), which are missing, which
are new, and which changed (answers, inputs or header fields). A refactor of
the drivers keeps every call with the same answers, or adds calls.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from niels_gpt_contracts.sandbox import oracle_run
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.oracle_run import Call, Job, Output
from niels_gpt_contracts.stagespec import Spec, load_schema, parse_specs
from niels_gpt_contracts.verdict import oracle

CAPTURE = "#capture"
HEADER = ("desc", "axes", "stages", "reduction", "rules", "relations", "compare", "computes_in")


def _specs(root: Path) -> dict[str, Spec]:
    texts = {f"specs/{p.name}": p.read_text() for p in (root / "specs").glob("*.toml")}
    return parse_specs(texts, load_schema((root / "specs/spec.schema.json").read_text()))


def _tensors(outputs: Mapping[str, Output]) -> dict[str, dict[str, Any]]:
    """Each tensor's torch dtype, shape and the sha256 of its bytes as sent."""
    return {
        key: {
            "dtype": out.dtype,
            "shape": list(out.data.shape),
            "sha256": hashlib.sha256(out.data.tobytes()).hexdigest(),
        }
        for key, out in sorted(outputs.items())
    }


def _record(call: Call, recipe: Call | None) -> dict[str, Any]:
    """One call as the dump keeps it (its recipe folded in as ``args``)."""
    found: dict[str, Any] = {
        "desc": call.desc,
        "axes": list(call.axes),
        "stages": call.stages,
        "reduction": call.reduction,
        "rules": list(call.rules),
        "relations": [dict(r) for r in call.relations],
        "compare": None if call.compare is None else list(call.compare),
        "computes_in": call.computes_in,
        "error": call.error,
        "message": call.message,
        "values": dict(call.values),
        "outputs": _tensors(call.outputs),
    }
    if recipe is not None:
        found["args"] = {
            "error": recipe.error,
            "message": recipe.message,
            "values": dict(recipe.values),
            "tensors": _tensors(recipe.outputs),
        }
    return found


def dump(
    root: Path, seed: int, stages: list[str], timeout: float, only: list[str]
) -> dict[str, Any]:
    """Every oracle call of ``root``'s stages (``stages``: all when empty) at ``seed``;
    ``only``: the calls matching these patterns alone (all when empty)."""
    specs = _specs(root)
    chosen = [s for s in specs.values() if s.oracle and (not stages or s.id in stages)]
    everyone = list(specs.values())
    modules = oracle._modules(everyone, {f for s in everyone for f in s.module_files})
    names = sorted({m.split(".")[0] for m in modules})
    entries = [oracle._entry(s, root, only=only) if only else oracle._entry(s, root)
               for s in chosen]  # fmt: skip
    drivers = [{**entry, "capture": True} for entry in entries]
    request = {"seed": seed, "names": names, "references": {}, "preload": modules,
               "paths": oracle._paths(root, chosen), "drivers": drivers}  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "code"
        for src in sorted(root.glob("packages/*/src")):
            shutil.copytree(src, code / src.relative_to(root))
        box = Sandbox.prepare(sys.executable, Path(tmp) / "box", names, threads=1)
        job = Job("dump", sorted(code.glob("packages/*/src")), request, threads=1)
        started = time.perf_counter()
        (stream,), _ = oracle_run.run(box, [job], timeout)
    out: dict[str, Any] = {
        "root": str(root),
        "seed": seed,
        "seconds": round(time.perf_counter() - started, 1),
        "problem": stream.problem or stream.fatal,
        "stages": {},
    }
    for spec in chosen:
        calls = {n: c for (s, n), c in stream.calls.items() if s == spec.id}
        out["stages"][spec.id] = {
            "driver_error": stream.driver_errors.get(spec.id),
            "held": {n: h.bytes for (s, n), h in stream.held.items() if s == spec.id},
            "calls": {
                name: _record(call, calls.get(name + CAPTURE))
                for name, call in calls.items()
                if not name.endswith(CAPTURE)
            },
        }
    return out


def _answer(call: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a call answered: its error, or every output's dtype, shape and hash."""
    outs = {k: (v["dtype"], v["shape"], v["sha256"]) for k, v in call["outputs"].items()}
    return call["error"], sorted(outs.items())


def compare(before: Mapping[str, Any], after: Mapping[str, Any], show: int) -> int:
    """Print the comparison per stage; 1 when a call is missing or answers otherwise."""
    worse = 0
    for problem in (before.get("problem"), after.get("problem")):
        if problem:
            print(f"a dump's worker failed: {problem}")
            worse = 1
    stages = sorted(set(before["stages"]) | set(after["stages"]))
    print(f"{'stage':<12} {'before':>6} {'after':>6} {'same':>6} {'missing':>7} {'new':>4} "
          f"{'answers':>7} {'inputs':>6} {'fields':>6}")  # fmt: skip
    for stage in stages:
        b = before["stages"].get(stage, {"calls": {}, "driver_error": None})
        a = after["stages"].get(stage, {"calls": {}, "driver_error": None})
        for side, got in (("before", b), ("after", a)):
            if got.get("driver_error"):
                print(f"{stage}: the {side} driver failed: {got['driver_error']}")
                worse = 1
        bc, ac = b["calls"], a["calls"]
        shared = sorted(set(bc) & set(ac))
        missing = sorted(set(bc) - set(ac))
        new = sorted(set(ac) - set(bc))
        answers = [n for n in shared if _answer(bc[n]) != _answer(ac[n])]
        inputs = [n for n in shared if bc[n].get("args") != ac[n].get("args")]
        fields = {
            n: [f for f in HEADER if bc[n][f] != ac[n][f]]
            for n in shared
            if any(bc[n][f] != ac[n][f] for f in HEADER)
        }
        same = len(shared) - len(answers)
        print(f"{stage:<12} {len(bc):>6} {len(ac):>6} {same:>6} {len(missing):>7} {len(new):>4} "
              f"{len(answers):>7} {len(inputs):>6} {len(fields):>6}")  # fmt: skip
        for label, names in (("missing", missing), ("new", new), ("answers", answers),
                             ("inputs", inputs)):  # fmt: skip
            if names:
                print(f"  {label}: {', '.join(names[:show])}{' ...' if len(names) > show else ''}")
        by_field: dict[str, list[str]] = {}
        for n, fs in fields.items():
            for f in fs:
                by_field.setdefault(f, []).append(n)
        for f, names in sorted(by_field.items()):
            print(f"  field {f} ({len(names)}): {', '.join(names[:show])}"
                  f"{' ...' if len(names) > show else ''}")  # fmt: skip
        worse |= bool(missing or answers)
    return worse


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    d = sub.add_parser("dump", help="run every oracle call of a tree and write what it answered")
    d.add_argument("--root", type=Path, default=Path(__file__).resolve().parents[2])
    d.add_argument("--seed", type=int, default=46)
    d.add_argument("--stage", action="append", default=[], help="stages (default: all)")
    d.add_argument("--only", action="append", default=[], help="call patterns (default: all)")
    d.add_argument("--timeout", type=float, default=7200.0)
    d.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("compare", help="compare two dumps stage by stage")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    c.add_argument("--show", type=int, default=8, help="names listed per kind of difference")
    args = parser.parse_args()
    if args.command == "compare":
        return compare(
            json.loads(args.before.read_text()), json.loads(args.after.read_text()), args.show
        )
    found = dump(args.root.resolve(), args.seed, args.stage, args.timeout, args.only)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(found, indent=1, sort_keys=True))
    total = sum(len(s["calls"]) for s in found["stages"].values())
    print(f"{total} calls of {len(found['stages'])} stages in {found['seconds']} s -> {args.out}")
    if found["problem"]:
        print(f"the worker failed: {found['problem']}")
    for stage, s in found["stages"].items():
        if s["driver_error"]:
            print(f"{stage}: the driver failed: {s['driver_error']}")
    return 1 if found["problem"] or any(s["driver_error"] for s in found["stages"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
