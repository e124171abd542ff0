"""Benchmark: how long ``contracts pr`` takes on one-stage PRs of this repository.

    python contracts/benchmarks/bench_pr.py [--stage attention] [--python PY]

Clones this repository's HEAD into a temporary folder and judges three PRs
of ``--stage`` (edits of its first module, ``modules`` in its spec), each
with a ``Stage:`` trailer, on one cache folder:

1. *cold*: a docstring edit, on an empty cache: the sandbox environment is
   built from ``constraints.txt`` (unless ``--python``) and every kill of the
   closure is proven (hinted tests first, ``specs/mutant-hints.json``);
2. *warm*: another docstring edit, on that cache: the environment is there
   and every kill proven in run 1 is reused (the proof keys hold the code's
   normal form, which a docstring does not change);
3. *code*: a change to the stage's code (a new private function nobody
   calls), on that cache: the environment is reused, and every kill of the
   closure is proven again, since any code change may hide a bug.

Prints each run's wall time, exit status, the verdict's phase times and its
closing line, and the machine's load (``/proc/loadavg``) before and after.
A figure, not a test. Targets on the 2-core CPU machine: a one-stage
docstring PR at most 3 min warm and 6 min cold, a code change at most 5 min.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[2]


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True
    )
    return done.stdout.strip()


def load() -> str:
    try:
        return Path("/proc/loadavg").read_text().strip()
    except OSError:
        return "unknown"


def first_module(repo: Path, stage: str) -> Path:
    """The stage's first owned module (``modules`` in its spec): its main one."""
    spec = tomllib.loads((repo / "specs" / f"{stage}.toml").read_text())
    return repo / "packages" / stage / "src" / spec["modules"][0]


def pr(repo: Path, base: str, name: str, stage: str, edit: str) -> None:
    """Branch ``name`` from ``base`` with one edit of the stage's first module."""
    git(repo, "checkout", "-q", "-b", name, base)
    module = first_module(repo, stage)
    text = module.read_text()
    if edit == "docstring":
        start = text.index('"""') + 3
        text = text[:start] + f"({name}) " + text[start:]
    else:
        text += "\n\ndef _bench_unused() -> int:\n    return 1\n"
    module.write_text(text)
    git(repo, "commit", "-qam", f"{stage}: a {edit} edit\n\nStage: {stage}")


def judge(repo: Path, base: str, python: str | None, cache: Path) -> tuple[float, int, list[str]]:
    args = [
        sys.executable, "-m", "niels_gpt_contracts.cli", "pr", "--repo", str(repo),
        "--base", base, "--head", "HEAD", "--cache-dir", str(cache),
    ]  # fmt: skip
    if python:
        args += ["--python", python]
    start = time.perf_counter()
    done = subprocess.run(args, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - start
    lines = done.stdout.strip().splitlines()
    shown = [line for line in lines if line.startswith("time: ")] + lines[-1:]
    return seconds, done.returncode, shown or [done.stderr.strip()[-300:]]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--stage", default="attention")
    parser.add_argument(
        "--python",
        help="sandbox interpreter (default: build one from constraints.txt in the cold run)",
    )
    args = parser.parse_args()
    print(f"load before: {load()}; {os.cpu_count()} CPUs")
    with tempfile.TemporaryDirectory(prefix="bench-pr-") as tmp:
        repo, cache = Path(tmp) / "repo", Path(tmp) / "cache"
        subprocess.run(["git", "clone", "-q", str(ROOT), str(repo)], check=True)
        base = git(repo, "rev-parse", "HEAD")
        module = first_module(repo, args.stage).relative_to(repo)
        print(f"one-stage PRs of {args.stage} on {module}, "
              f"base {base[:12]}")  # fmt: skip
        for label, edit in (("cold", "docstring"), ("warm", "docstring"), ("code", "code")):
            pr(repo, base, f"bench-{label}", args.stage, edit)
            seconds, code, shown = judge(repo, base, args.python, cache)
            print(f"  {label:<5} {seconds:7.1f} s  exit {code}  {shown[-1]}")
            for line in shown[:-1]:
                print(f"        {line}")
    print(f"load after: {load()}")


if __name__ == "__main__":
    main()
