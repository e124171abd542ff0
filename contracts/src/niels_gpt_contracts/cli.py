"""``contracts``: the niels_gpt spec gate.

    contracts check                                   every stage, working tree
    contracts check --reports reports                 ... plus invariant x device
    contracts check --stage S --base REV [--head REV] the PR gate for stage S
    contracts check --base REV                        ... stage from 'Stage:' trailers
    contracts check --pre-push                        ... the refs pre-commit pushes
    contracts mutants [--stage S]                     the catalogued bugs must be killed
    contracts pr --base REV [--head REV] [--full]     the whole trusted PR verdict
    contracts prepare [--cache-dir DIR]               build pr's sandbox interpreter ahead

Exit status: 0 every check KEPT; 1 something BROKEN; 2 a usage or
configuration error (unknown stage, unreadable or malformed spec, base not
found, not a git repository, bad report). An error never exits 0.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NoReturn

from niels_gpt_contracts.checks.devices import DEVICES
from niels_gpt_contracts.checks.gate import Request, run
from niels_gpt_contracts.errors import ConfigError, SpecErrors
from niels_gpt_contracts.mutants import report as mutants_report
from niels_gpt_contracts.mutants import runner as mutants_runner
from niels_gpt_contracts.reporters import FORMATS, renderer, stderr_guard
from niels_gpt_contracts.reporters.text import progress_lines
from niels_gpt_contracts.result import Outcome, Result
from niels_gpt_contracts.sandbox import processes
from niels_gpt_contracts.sandbox.environment import build
from niels_gpt_contracts.verdict import pr as pr_verdict
from niels_gpt_contracts.verdict.state import PrRequest

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


def _pre_push_refs(base: str | None, head: str | None) -> tuple[str, str]:
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


def _progress(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _row(row: Outcome, seconds: float) -> None:
    """A row of ``contracts pr``, printed to stderr as soon as it is known."""
    for line in progress_lines(row, seconds):
        _progress(line)


def _main_mutants(args: argparse.Namespace) -> int:
    return _ending(lambda: _mutants(args))


def _mutants(args: argparse.Namespace) -> int:
    render = mutants_report.render_json if args.format == "json" else mutants_report.render_text
    opts = mutants_runner.Options(
        repo=args.repo,
        stages=list(args.stage),
        only=list(args.mutant),
        use_cache=args.use_cache,
        jobs=args.jobs,
        timeout=args.timeout,
        fork=args.fork,
        progress=_progress if args.format == "text" else None,
        write_hints=args.write_hints,
    )
    try:
        result = mutants_runner.run(opts)
    except processes.Ended as err:
        sys.stderr.write(f"contracts: error: {err}: every mutant run was killed; no result\n")
        return EXIT_ERROR
    except ConfigError as err:  # SpecErrors included
        sys.stderr.write(f"contracts: error: {err}\n")
        if args.format != "text":
            _emit(mutants_report.render_error(str(err)), args.output)
        return EXIT_ERROR
    except Exception as err:  # a bug in the checker must never look like a verdict
        traceback.print_exc()
        message = f"internal error ({type(err).__name__}: {err}); this is a bug in contracts"
        sys.stderr.write(f"contracts: error: {message}\n")
        if args.format != "text":
            _emit(mutants_report.render_error(message), args.output)
        return EXIT_ERROR
    _emit(render(result), args.output)
    return EXIT_KEPT if result.ok else EXIT_BROKEN


def _main_prepare(args: argparse.Namespace) -> int:
    constraints = args.repo / "constraints.txt"
    try:
        text = constraints.read_text(encoding="utf-8")
        python = build(args.cache_dir.resolve(), text, _progress)
    except OSError as err:
        sys.stderr.write(
            f"contracts: error: {constraints}: expected constraints, found none ({err})\n"
        )
        return EXIT_ERROR
    except ConfigError as err:
        sys.stderr.write(f"contracts: error: {err}\n")
        return EXIT_ERROR
    sys.stdout.write(python + "\n")
    return EXIT_KEPT


def _main_pr(args: argparse.Namespace) -> int:
    render, render_error = renderer(args.format)
    request = PrRequest(
        repo=args.repo,
        base=args.base,
        head=args.head,
        stage=args.stage,
        python=args.python,
        cache=args.cache_dir.resolve(),
        devices=tuple(dict.fromkeys((*args.device, *args.require_device))),
        require_devices=args.require_device,
        jobs=args.jobs,
        timeout=args.timeout,
        mutants=not args.skip_mutants,
        oracle_seed=args.oracle_seed,
        out=args.out,
        full=args.full,
    )

    def verdict() -> Result:
        return pr_verdict.run(request, _progress, _row)

    return _ending(lambda: _judged(verdict, render, render_error, args))


def _ending(work: Callable[[], int]) -> int:
    """``work()`` with the ending signals handled: a SIGTERM, SIGINT, SIGHUP or SIGQUIT
    kills every process it started and exits 2 at once (never 0), one line on stderr."""
    code = EXIT_ERROR
    try:
        with processes.ending_on_signals(EXIT_ERROR):
            code = work()
    except processes.Ended as err:  # it came while an error or the result was being reported
        sys.stderr.write(f"contracts: error: {err}: every worker of the verdict was killed\n")
    if processes.ended() is not None:
        # Threads of the verdict may still hold workers: end the tree and the process now.
        processes.kill_tree()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(EXIT_ERROR)
    return code


def _judged(
    judge: Callable[[], Result],
    render: Callable[[Result], str],
    render_error: Callable[[str], str],
    args: argparse.Namespace,
) -> int:
    """Run a judgement; exit 0/1 on a verdict, 2 (and no verdict) on any error."""
    try:
        result = judge()
    except processes.Ended as err:
        message = f"{err}: every worker of the verdict was killed; no verdict"
        sys.stderr.write(f"contracts: error: {message}\n")
        if args.format != "text":
            _emit(render_error(message), args.output)
        return EXIT_ERROR
    except SpecErrors as err:
        for one in err.errors:
            sys.stderr.write(f"contracts: error: {one}\n")
        if args.format != "text":
            _emit(render_error(str(err)), args.output)
        return EXIT_ERROR
    except ConfigError as err:
        sys.stderr.write(f"contracts: error: {err}\n")
        if args.format != "text":
            _emit(render_error(str(err)), args.output)
        return EXIT_ERROR
    except Exception as err:  # a bug in the checker must never look like a verdict
        traceback.print_exc()
        message = f"internal error ({type(err).__name__}: {err}); this is a bug in contracts"
        sys.stderr.write(f"contracts: error: {message}\n")
        if args.format != "text":
            _emit(render_error(message), args.output)
        return EXIT_ERROR
    _emit(render(result), args.output)
    return EXIT_KEPT if result.ok else EXIT_BROKEN


def _emit(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8", errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")
    args = build_parser().parse_args(argv)
    with stderr_guard(getattr(args, "format", "text")):
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    if args.command == "mutants":
        return _main_mutants(args)
    if args.command == "pr":
        return _main_pr(args)
    if args.command == "prepare":
        return _main_prepare(args)
    render, render_error = renderer(args.format)

    def judge() -> Result:
        if args.pre_push:
            args.base, args.head = _pre_push_refs(args.base, args.head)
        request = Request(
            repo=args.repo,
            stage=args.stage,
            base=args.base,
            head=args.head,
            reports_dir=args.reports,
            report_files=list(args.report),
            require_devices=args.require_device,
            api=not args.no_api,
            python=args.python,
        )
        return run(request)

    return _judged(judge, render, render_error, args)


if __name__ == "__main__":
    sys.exit(main())
