"""Benchmark: how long the PR gate takes to judge a diff of 10,000 changed files.

    python contracts/benchmarks/bench_large_diff.py [--files N] [--repeat R]

Builds a throwaway git repository (a copy of the test layout: two stages,
the real spec schema), commits N changed files on a PR branch (most inside
the stage's allowlist, some forbidden, some with spaces and non-ASCII names,
some renamed), then times ``contracts check --stage alpha --base main --head
pr --no-api`` end to end in-process: git diff, path judgement, static rules,
invariant scan and report. Prints the best of R runs. The target is < 2 s.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from gatekit import make_repo

from niels_gpt_contracts.cli import main


def build(root: Path, n: int) -> None:
    repo = make_repo(root)
    repo.branch("pr")
    for i in range(n):
        if i % 100 == 0:
            path = f"packages/beta/data/forbidden {i:05d}.txt"
        elif i % 10 == 0:
            path = f"packages/alpha/data/ünï cødé/{i // 1000}/f{i:05d}.txt"
        else:
            path = f"packages/alpha/data/{i // 1000}/f{i:05d}.txt"
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"{i}\n", encoding="utf-8")
    repo.commit("many files")


def main_bench() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="contracts-bench-") as tmp:
        root = Path(tmp) / "repo"
        t0 = time.perf_counter()
        build(root, args.files)
        print(
            f"built a repository with {args.files} changed files in "
            f"{time.perf_counter() - t0:.1f} s"
        )
        times = []
        for _ in range(args.repeat):
            out = io.StringIO()
            start = time.perf_counter()
            with contextlib.redirect_stdout(out):
                code = main(
                    [
                        "check",
                        "--repo",
                        str(root),
                        "--stage",
                        "alpha",
                        "--base",
                        "main",
                        "--head",
                        "pr",
                        "--no-api",
                        "--format",
                        "json",
                    ]
                )
            times.append(time.perf_counter() - start)
        expected = args.files // 100
        found = out.getvalue().count('"rule": "path.forbidden"')
        assert code == 1 and found == expected, (code, found, expected)
        print(
            f"judged {args.files} changed files ({found} forbidden found) in "
            f"{min(times):.3f} s (best of {args.repeat}; runs: "
            f"{', '.join(f'{t:.3f}' for t in times)})"
        )


if __name__ == "__main__":
    main_bench()
