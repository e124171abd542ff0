"""``contracts``: the niels_gpt spec gate.

Subcommands ``check``, ``mutants``, ``pr`` and ``prepare``, and the
maintainers' ``spec api`` and ``new-stage`` (``authoring.commands``); the
usage is contracts/README.md's. Exit status: 0 every check KEPT; 1 something
BROKEN; 2 a usage or configuration error. An error never exits 0.

The options and the exit statuses are ``arguments``'; this module runs the
subcommand they name and turns its outcome, error or signal into the status.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol, TypeVar

from niels_gpt_contracts.arguments import (
    EXIT_BROKEN,
    EXIT_ERROR,
    EXIT_KEPT,
    build_parser,
    pre_push_refs,
)
from niels_gpt_contracts.authoring import commands as authoring_commands
from niels_gpt_contracts.errors import ConfigError, SpecErrors
from niels_gpt_contracts.mutants import runner as mutants_runner
from niels_gpt_contracts.reporters import mutant_report, renderer, stderr_guard
from niels_gpt_contracts.reporters.text import progress_lines
from niels_gpt_contracts.result import Outcome, Result
from niels_gpt_contracts.sandbox import processes
from niels_gpt_contracts.sandbox.environment import build
from niels_gpt_contracts.verdict import pr as pr_verdict
from niels_gpt_contracts.verdict.state import PrRequest
from niels_gpt_contracts.verdict.static_verdict import Request, run

# The exit statuses and the parser are defined in ``arguments``, and named here too.
__all__ = ["EXIT_BROKEN", "EXIT_ERROR", "EXIT_KEPT", "build_parser", "main"]


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
    render = mutant_report.render_json if args.format == "json" else mutant_report.render_text
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
    killed = "every mutant run was killed; no result"
    error = mutant_report.render_error
    return _judged(lambda: mutants_runner.run(opts), render, error, args, killed)


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


class _Judgement(Protocol):
    @property
    def ok(self) -> bool: ...


J = TypeVar("J", bound=_Judgement)


def _judged(
    judge: Callable[[], J],
    render: Callable[[J], str],
    render_error: Callable[[str], str],
    args: argparse.Namespace,
    killed: str = "every worker of the verdict was killed; no verdict",
) -> int:
    """Run a judgement (a verdict or a mutant run); exit 0/1 on its result, 2 (and no
    result) on any error, ``killed`` saying what an ending signal left."""
    try:
        result = judge()
    except processes.Ended as err:
        message = f"{err}: {killed}"
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
    if args.command in authoring_commands.COMMANDS:
        return authoring_commands.run(args)
    render, render_error = renderer(args.format)

    def judge() -> Result:
        if args.pre_push:
            args.base, args.head = pre_push_refs(args.base, args.head)
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
