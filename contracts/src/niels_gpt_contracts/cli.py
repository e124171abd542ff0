"""``contracts``: the niels_gpt spec gate.

    contracts check                                   every stage, working tree
    contracts check --reports reports                 ... plus invariant x device
    contracts check --stage S --base REV [--head REV] the PR gate for stage S
    contracts check --base REV                        ... stage from 'Stage:' trailers

Exit status: 0 every check KEPT; 1 something BROKEN; 2 a usage or
configuration error (unknown stage, unreadable or malformed spec, base not
found, not a git repository, bad report). An error never exits 0.
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from niels_gpt_contracts.checks.devices import DEVICES
from niels_gpt_contracts.checks.gate import Request, run
from niels_gpt_contracts.errors import ConfigError, SpecErrors
from niels_gpt_contracts.reporters import FORMATS, renderer

EXIT_KEPT, EXIT_BROKEN, EXIT_ERROR = 0, 1, 2


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
    check.add_argument("--format", choices=sorted(FORMATS), default="text")
    check.add_argument(
        "--output", type=Path, metavar="FILE", help="write the report here instead of stdout"
    )
    check.add_argument(
        "--repo",
        type=Path,
        default=Path(),
        metavar="DIR",
        help="repository to check (default: the current directory)",
    )
    check.add_argument(
        "--no-api", action="store_true", help="skip the import-based API check (no torch needed)"
    )
    return parser


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
    render, render_error = renderer(args.format)
    request = Request(
        repo=args.repo,
        stage=args.stage,
        base=args.base,
        head=args.head,
        reports_dir=args.reports,
        report_files=list(args.report),
        require_devices=args.require_device,
        api=not args.no_api,
    )
    try:
        result = run(request)
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


if __name__ == "__main__":
    sys.exit(main())
