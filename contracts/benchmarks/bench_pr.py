"""Benchmark: how long ``contracts pr`` takes on a one-stage PR of this repository.

    python contracts/benchmarks/bench_pr.py [--stage attention] [--python PY]

Clones this repository's HEAD into a temporary folder, commits a one-line
docstring change to the stage's first module with a ``Stage:`` trailer, and
runs ``contracts pr --base main~0 --head pr`` three times:

1. *cold*: a fresh cache directory (no mutant kill known);
2. *warm*: the same PR again with that cache, as after a push that changed
   no code (every kill proven in run 1 is reused: the key holds all code and
   tests, so it matches exactly when nothing the kills depend on changed);
3. *tests-only*: another PR from the same base that only adds a test, with
   the same cache: its code is the base's, which runs 1 and 2 never judged,
   so its kills are proven afresh.

``--python`` is the sandbox interpreter (default: this one, which must have
torch, pytest, hypothesis and pytest-xdist); building one from
``constraints.txt`` is timed separately by ``contracts prepare`` and cached
per constraints file. Prints each run's wall time, exit status and verdict
line. A figure, not a test: the target is under 5 minutes for a one-stage PR.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def first_module(repo: Path, stage: str) -> Path:
    return sorted((repo / "packages" / stage / "src").rglob("*.py"))[0]


def judge(repo: Path, base: str, python: str, cache: Path) -> tuple[float, int, str]:
    start = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable, "-m", "niels_gpt_contracts.cli", "pr", "--repo", str(repo),
            "--base", base, "--head", "HEAD", "--python", python, "--cache-dir", str(cache),
        ],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    seconds = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    return seconds, done.returncode, lines[-1] if lines else done.stderr.strip()[-300:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--stage", default="attention")
    parser.add_argument("--python", default=sys.executable)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-pr-") as tmp:
        repo, cache = Path(tmp) / "repo", Path(tmp) / "cache"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        base = git(repo, "rev-parse", "HEAD")
        git(repo, "checkout", "-q", "-b", "pr")
        module = first_module(repo, args.stage)
        module.write_text(module.read_text() + "\n# A comment, as a docstring-only PR.\n")
        git(repo, "commit", "-qam", f"one-line change\n\nStage: {args.stage}")
        print(f"one-stage PR of {args.stage}: {module.relative_to(repo)}, base {base[:12]}")
        for label in ("cold", "warm"):
            seconds, code, verdict = judge(repo, base, args.python, cache)
            print(f"  {label:<11} {seconds:7.1f} s  exit {code}  {verdict}")
        git(repo, "checkout", "-q", "-b", "tests-only", base)
        test = sorted((repo / "packages" / args.stage / "tests").glob("test_*.py"))[0]
        (test.parent / "test_bench_extra.py").write_text("def test_extra() -> None:\n    pass\n")
        git(repo, "add", "-A")
        git(repo, "commit", "-qm", f"a new test\n\nStage: {args.stage}")
        seconds, code, verdict = judge(repo, base, args.python, cache)
        print(f"  {'tests-only':<11} {seconds:7.1f} s  exit {code}  {verdict}")


if __name__ == "__main__":
    main()
