"""Benchmark: does the oracle ever reject this checkout's own code? (false BROKEN rate)

    python contracts/benchmarks/oracle_noise.py [--seeds 4] [--stage attention ...]

For each drawn seed, starts the oracle's workers the way ``verdict.oracle``
does, all on this checkout's code: the PR's side (default thread count, as a
user's process), the base's side (one thread) and, for every stage whose spec
names float64 references with ``reference_calls``, a reference worker (its
own references, the other stages this checkout's code). A PR that changes nothing
must be KEPT on every seed: each violation printed is a bound too tight for
honest rounding, a driver that draws differently on two sides, or a
reference that disagrees with the code. Also prints, per stage, on how many
calls the base itself differs from its reference (the calls the reference
alone then decides) and how long each worker took. A figure, not a test.
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import sys
import tempfile
import time
from pathlib import Path

from niels_gpt_contracts.sandbox import oracle_run
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.sandbox.oracle_run import Job
from niels_gpt_contracts.stagespec import Spec, load_schema, parse_specs
from niels_gpt_contracts.verdict import oracle

ROOT = Path(__file__).resolve().parents[2]


def _specs() -> dict[str, Spec]:
    texts = {f"specs/{p.name}": p.read_text() for p in (ROOT / "specs").glob("*.toml")}
    return parse_specs(texts, load_schema((ROOT / "specs/spec.schema.json").read_text()))


def _jobs(specs: dict[str, Spec], stages: list[Spec], code: Path, seed: int) -> list[Job]:
    everyone = list(specs.values())
    modules = oracle._modules(everyone, {f for s in everyone for f in s.module_files})
    names = sorted({m.split(".")[0] for m in modules})
    common = {"seed": seed, "names": names, "references": {}, "preload": modules,
              "paths": oracle._paths(ROOT, stages)}  # fmt: skip
    roots = sorted(code.glob("packages/*/src"))
    jobs = [
        Job(
            "head",
            roots,
            {**common, "drivers": [oracle._entry(s, ROOT, watch=True) for s in stages]},
        ),
        Job(
            "base",
            roots,
            {**common, "drivers": [oracle._entry(s, ROOT) for s in stages]},
            threads=1,
        ),
    ]
    for spec in stages:
        assert spec.oracle is not None
        if not (spec.oracle.references and spec.oracle.reference_calls):
            continue
        refs = {m: str(ROOT / f) for m, f in spec.oracle.references.items()}
        request = {
            **common,
            "preload": [],
            "references": refs,
            "paths": oracle._paths(ROOT, [spec]),
            "drivers": [oracle._entry(spec, ROOT, only=list(spec.oracle.reference_calls))],
        }
        jobs.append(Job(f"reference:{spec.id}", roots, request, threads=1))
    return jobs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--stage", action="append", help="stages to drive (default: all)")
    args = parser.parse_args()
    specs = _specs()
    stages = [s for s in specs.values() if s.oracle and (not args.stage or s.id in args.stage)]
    print(f"load before: {Path('/proc/loadavg').read_text().strip()}", flush=True)
    rejected = 0
    with tempfile.TemporaryDirectory() as tmp:
        code = Path(tmp) / "code"
        for src in sorted(ROOT.glob("packages/*/src")):
            shutil.copytree(src, code / src.relative_to(ROOT))
        names = sorted({rel.split("/")[0] for s in specs.values() for rel in s.modules})
        box = Sandbox.prepare(sys.executable, Path(tmp) / "box", names, threads=1)
        for _ in range(args.seeds):
            seed = secrets.randbits(63)
            started = time.perf_counter()
            streams, _ = oracle_run.run(box, _jobs(specs, stages, code, seed), 1800.0)
            head, base, refs = streams[0], streams[1], streams[2:]
            for s in streams[1:]:
                if s.problem or s.fatal or s.driver_errors:
                    print(f"seed {seed:#x}: {s.label} failed: {s.problem or s.fatal}")
                    print(f"  {s.driver_errors}")
            unswept = oracle._unswept(stages, streams[1:])
            if unswept:
                print(f"seed {seed:#x}: a declared axis unswept (a ConfigError): {unswept}")
            by_stage = {r.label.split(":", 1)[1]: r for r in refs}
            outcome, _ = oracle._decide(
                stages[0].id, stages, stages, by_stage, head, base, seed, {}
            )
            took = ", ".join(f"{s.label} {s.seconds:.0f} s" for s in streams)
            print(f"seed {seed:#x}: {outcome.status} in {time.perf_counter() - started:.0f} s "
                  f"({took}): {outcome.summary}", flush=True)  # fmt: skip
            for v in outcome.violations:
                print(f"  {v.rule}: {v.message[:400]}", flush=True)
            for name, r in by_stage.items():
                history = oracle.diverged(specs[name], base, r)
                if history:
                    print(f"  {name}: base differs from its reference on {sorted(history)[:5]}")
            rejected += outcome.status != "KEPT"
    print(f"load after: {Path('/proc/loadavg').read_text().strip()}")
    print(f"rejected {rejected}/{args.seeds} seeds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
