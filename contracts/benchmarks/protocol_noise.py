"""Benchmark: does the module protocol ever reject this checkout's own code? (false BROKEN)

    python contracts/benchmarks/protocol_noise.py [--seeds 5] [--python PY]

For each drawn seed, runs the ``protocol`` phase's two workers the way
``verdict.protocol`` does, both on this checkout's code (every stage's
classes): the base's side first (one thread), the PR's side (default thread
count) over the base's weights. A PR that changes nothing must be KEPT on
every seed: a violation printed is a bound too tight for honest rounding or
a measurement that differs between two runs of the same code. Prints each
seed's row and the workers' times. A figure, not a test.
"""

from __future__ import annotations

import argparse
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

from niels_gpt_contracts.checks.ownership.modules import namespaces
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.stagespec import Spec, load_schema, parse_specs
from niels_gpt_contracts.verdict import protocol

ROOT = Path(__file__).resolve().parents[2]


def _specs() -> dict[str, Spec]:
    texts = {f"specs/{p.name}": p.read_text() for p in (ROOT / "specs").glob("*.toml")}
    return parse_specs(texts, load_schema((ROOT / "specs/spec.schema.json").read_text()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    specs = _specs()
    everyone = list(specs.values())
    rejected = 0
    with tempfile.TemporaryDirectory(prefix="protocol-noise-") as tmp:
        box = Sandbox.prepare(args.python, Path(tmp) / "box", namespaces(specs), threads=1)
        # The stages' sources copied out, as a verdict writes its workspace: the
        # checkout itself changes under the gauge as people work in it.
        tree = Path(tmp) / "tree"
        for src in sorted(ROOT.glob("packages/*/src")):
            rel = src.relative_to(ROOT)
            shutil.copytree(src, tree / rel, ignore=shutil.ignore_patterns("__pycache__"))
        code = (tree, tree)
        print(f"load {os.getloadavg()[0]:.1f}; classes: {len(protocol.module_classes(everyone))}")
        for i in range(args.seeds):
            seed = secrets.randbits(63)
            scratch = box.tmp / f"seed{i}"
            request = protocol.request_for(everyone, everyone, seed)
            base, head, changed = protocol._run(box, code, request, scratch, 900.0)
            if base.problem or base.report.get("fatal"):
                print(f"seed {seed:#x}: the base's worker failed: {base.problem}")
                return 2
            row = protocol.decide(everyone[0], everyone, request["sizes"], base, head, seed)
            rejected += row.status != "KEPT" or bool(changed)
            print(f"seed {seed:#x}: {row.status} {row.summary}")
            if changed:
                print(f"  changed while the PR's side ran: {changed[:3]}")
            print(f"  base {base.seconds:.1f} s, head {head.seconds:.1f} s")
            for v in row.violations:
                print(f"  {v.rule}: {v.message[:300]}")
            shutil.rmtree(scratch, ignore_errors=True)
    print(f"{rejected} of {args.seeds} seeds rejected this checkout's own code")
    return 1 if rejected else 0


if __name__ == "__main__":
    raise SystemExit(main())
