"""The ``contracts`` command line: its subcommands, their options, its exit statuses.

``build_parser`` gives the ``argparse`` parser of ``check``, ``mutants``,
``pr`` and ``prepare`` (and the maintainers' ``spec api`` and ``new-stage``,
``authoring.commands``); a usage error (an unknown option, a device outside
``checks.evidence.devices.DEVICES``) prints the usage and exits ``EXIT_ERROR`` (2),
never 0. ``pre_push_refs`` turns ``check --pre-push`` into the base and head
pre-commit's pre-push stage gives, and raises ``ConfigError`` when it gives
none. What each subcommand then does is ``cli``'s.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import NoReturn

from niels_gpt_contracts.authoring import commands as authoring_commands
from niels_gpt_contracts.checks.evidence.devices import DEVICES
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.mutants import runner as mutants_runner
from niels_gpt_contracts.reporters import FORMATS

EXIT_KEPT, EXIT_BROKEN, EXIT_ERROR = 0, 1, 2
# What pre-commit's pre-push stage sets: the remote's old tip (or the parent of
# the first commit the remote lacks) and the local commit being pushed.
PRE_PUSH_REFS = ("PRE_COMMIT_FROM_REF", "PRE_COMMIT_TO_REF")


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_ERROR, f"contracts: error: {message}\n")


def _devices(value: str) -> tuple[str, ...]:
    names = tuple(v.strip() for v in value.split(",") if v.strip())
    bad = [n for n in names if n not in DEVICES]
    if bad or not names:
        raise argparse.ArgumentTypeError(
            f"expected a comma-separated subset of {','.join(DEVICES)}, found {value!r}"
        )
    return names


def _add_output_and_repo(parser: argparse.ArgumentParser) -> None:
    """``--output`` and ``--repo``, shared by every subcommand."""
    parser.add_argument(
        "--output", type=Path, metavar="FILE", help="write the report here instead of stdout"
    )
    parser.add_argument(
        "--repo",
        type=Path,
        default=Path(),
        metavar="DIR",
        help="repository to check (default: the current directory)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="contracts", description="The niels_gpt spec gate.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    check = sub.add_parser(
        "check",
        help="judge the working tree, or a PR with --base",
        description="Without --base: every stage (or --stage) on the working tree. With "
        "--base: the PR gate for one stage, spec read from the base revision.",
    )
    check.add_argument(
        "--stage",
        help="stage id (a specs/<id>.toml); for a PR gate without "
        "it, the 'Stage:' trailer of the PR's commits decides",
    )
    check.add_argument("--base", metavar="REV", help="gate a PR against this base revision")
    check.add_argument("--head", metavar="REV", help="the PR's head (default: the working tree)")
    check.add_argument(
        "--reports",
        type=Path,
        metavar="DIR",
        help="directory of invariants-<device>.json reports from test-<device>",
    )
    check.add_argument(
        "--report",
        type=Path,
        action="append",
        default=[],
        metavar="FILE",
        help="one invariant report (repeatable)",
    )
    check.add_argument(
        "--require-device",
        type=_devices,
        default=(),
        metavar="D[,D]",
        help="devices that must have verified every invariant (NOT RUN fails)",
    )
    check.add_argument(
        "--pre-push",
        action="store_true",
        help="gate what is being pushed: --base $PRE_COMMIT_FROM_REF --head "
        "$PRE_COMMIT_TO_REF, as pre-commit's pre-push stage sets them (exit 2 if unset)",
    )
    check.add_argument("--format", choices=sorted(FORMATS), default="text")
    _add_output_and_repo(check)
    check.add_argument(
        "--no-api", action="store_true", help="skip the import-based API check (no torch needed)"
    )
    check.add_argument(
        "--python",
        metavar="PY",
        help="interpreter that imports the stages for the API check (it needs torch; "
        "default: this one), e.g. the one 'contracts prepare' prints",
    )
    _add_mutants_parser(sub)
    _add_pr_parser(sub)
    prepare = sub.add_parser(
        "prepare",
        help="build the sandbox interpreter 'contracts pr' would build, and print its path",
        description="Build (or find) the virtual environment 'contracts pr' runs the PR's code "
        "in, from the repository's constraints.txt, under --cache-dir. Trusted CI on the "
        "default branch runs it to warm the cache that PR runs only read.",
    )
    prepare.add_argument("--cache-dir", type=Path, default=Path(".contracts-cache"), metavar="DIR")
    prepare.add_argument("--repo", type=Path, default=Path(), metavar="DIR")
    authoring_commands.add_parsers(sub)  # spec api, new-stage
    return parser


def _add_pr_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    pr = sub.add_parser(
        "pr",
        help="the whole verdict on a stage PR: static checks, the base's tests over the "
        "PR's code, runtime rules, mutants",
        description="Judge a stage PR from this (trusted) checker: specs from the base, the "
        "PR's code run only in a sandboxed interpreter, the base's and the maintainers' "
        "tests deciding. Exit 0 KEPT, 1 BROKEN, 2 the verdict could not be given.",
    )
    pr.add_argument("--base", metavar="REV", required=True, help="the PR's base revision")
    pr.add_argument("--head", metavar="REV", help="the PR's head (default: the working tree)")
    pr.add_argument("--stage", help="stage id (default: the commits' 'Stage:' trailer)")
    pr.add_argument(
        "--python",
        metavar="PY",
        help="interpreter to run the PR's code with (it needs torch, pytest, hypothesis, "
        "pytest-xdist); default: a venv built from the base's constraints.txt in --cache-dir",
    )
    pr.add_argument(
        "--cache-dir",
        type=Path,
        default=Path(".contracts-cache"),
        metavar="DIR",
        help="built environments and proven mutant kills (default: .contracts-cache)",
    )
    pr.add_argument(
        "--device",
        type=_devices,
        default=("cpu",),
        metavar="D[,D]",
        help="devices to run the tests on (default: cpu)",
    )
    pr.add_argument(
        "--require-device",
        type=_devices,
        default=(),
        metavar="D[,D]",
        help="devices that must verify every invariant (NOT RUN fails)",
    )
    pr.add_argument(
        "--jobs", type=int, default=0, metavar="N", help="parallel test workers (default: CPUs)"
    )
    pr.add_argument(
        "--timeout", type=float, default=1800.0, metavar="S", help="time limit of one test run"
    )
    pr.add_argument(
        "--full",
        action="store_true",
        help="run every check even after one is BROKEN (default: stop at the first BROKEN "
        "row, and at the first surviving mutant; the rest are NOT RUN rows)",
    )
    pr.add_argument(
        "--skip-mutants",
        action="store_true",
        help="leave the mutants out (NOT RUN): for a device job beside a full verdict on cpu",
    )
    pr.add_argument(
        "--oracle-seed",
        type=lambda text: int(text, 0),
        default=None,
        metavar="N",
        help="replay the oracle with the seed a verdict printed (default: a fresh secret one)",
    )
    pr.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="where a BROKEN oracle row's reproducer goes (default: <repo>/reports/oracle)",
    )
    pr.add_argument("--format", choices=sorted(FORMATS), default="text")
    _add_output_and_repo(pr)


def _add_mutants_parser(sub: argparse._SubParsersAction[_Parser]) -> None:
    mutants = sub.add_parser(
        "mutants",
        help="run each catalogued mutant against its stage's tests",
        description="Run the stage's tests clean, then once per [[mutants]] entry of its "
        "spec; every mutant must be killed. Exit 0 all killed, 1 a survivor, stale mutant "
        "or run error, 2 a usage or configuration error (including a failing clean run).",
    )
    mutants.add_argument(
        "--stage",
        action="append",
        default=[],
        help="stage id (repeatable; default: every stage with mutants)",
    )
    mutants.add_argument(
        "--mutant",
        action="append",
        default=[],
        metavar="ID",
        help="run only this mutant ('<stage>.<id>' or '<id>'; repeatable)",
    )
    mutants.add_argument(
        "--all",
        "--no-cache",
        dest="use_cache",
        action="store_false",
        help="run every mutant, even ones killed before with unchanged module and tests",
    )
    mutants.add_argument(
        "--write-hints",
        action="store_true",
        help="rewrite specs/mutant-hints.json with the test that killed each mutant (hints "
        "order the runs; they never count as a kill)",
    )
    mutants.add_argument(
        "--jobs", type=int, default=0, metavar="N", help="parallel runs (default: CPU count)"
    )
    mutants.add_argument(
        "--timeout",
        type=float,
        default=mutants_runner.DEFAULT_TIMEOUT,
        metavar="S",
        help="seconds a mutant run may take before it is an error",
    )
    mutants.add_argument(
        "--no-fork",
        dest="fork",
        action="store_false",
        help="start a fresh python per run instead of forking from a preloaded server",
    )
    mutants.add_argument("--format", choices=["text", "json"], default="text")
    _add_output_and_repo(mutants)


def pre_push_refs(base: str | None, head: str | None) -> tuple[str, str]:
    """``(base, head)`` from pre-commit's pre-push variables; fails closed.

    A push of a branch whose history the remote lacks entirely (its root
    commit) gets no refs from pre-commit: there is no base to judge against.
    """
    if base or head:
        raise ConfigError(
            f"--pre-push: expected no --base/--head beside it (pre-commit gives the refs), "
            f"found --base {base!r} --head {head!r}"
        )
    refs = [os.environ.get(name, "").strip() for name in PRE_PUSH_REFS]
    missing = [name for name, ref in zip(PRE_PUSH_REFS, refs, strict=True) if not ref]
    if missing:
        raise ConfigError(
            f"--pre-push: expected {' and '.join(PRE_PUSH_REFS)} from pre-commit's pre-push "
            f"stage, found {' and '.join(missing)} unset or empty (pushing a root commit gives "
            "no base; run the gate with --base, or skip the hook with SKIP=contracts-pr)"
        )
    return refs[0], refs[1]
