"""``contracts spec api`` and ``contracts new-stage``: their options and what they print.

- ``contracts spec api --freeze STAGE [--all]`` prints the ``[[api]]`` tables
  of ``specs/STAGE.toml`` produced from the stage's source (``freeze``);
  ``--check STAGE`` compares them with the spec's and exits 1 on a difference.
- ``contracts new-stage NAME --after STAGE`` writes a new stage's skeleton
  (``scaffold``) and prints the paths it wrote.

Exit statuses are the checker's: 0 done or equal, 1 different, 2 an error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from niels_gpt_contracts.checks.context.loading import load_specs
from niels_gpt_contracts.errors import ConfigError, SpecErrors
from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree

EXIT_KEPT, EXIT_BROKEN, EXIT_ERROR = 0, 1, 2
COMMANDS = ("spec", "new-stage")


def add_parsers(sub: argparse._SubParsersAction[Any]) -> None:
    """Register ``spec`` and ``new-stage`` on the ``contracts`` subcommands."""
    spec = sub.add_parser("spec", help="maintainers' tools over a stage's spec")
    spec_sub = spec.add_subparsers(dest="spec_command", required=True)
    api = spec_sub.add_parser(
        "api",
        help="the [[api]] tables from the stage's source (griffe, no import)",
        description="Read the stage's packages with griffe and print the [[api]] tables "
        "its spec pins (--freeze), or compare them with the spec's (--check: exit 1 "
        "when they differ).",
    )
    mode = api.add_mutually_exclusive_group(required=True)
    mode.add_argument("--freeze", metavar="STAGE", help="print the frozen [[api]] tables")
    mode.add_argument("--check", metavar="STAGE", help="exit 1 if the spec's tables differ")
    api.add_argument(
        "--all",
        action="store_true",
        help="pin every export of the stage's public packages, not the spec's selection",
    )
    api.add_argument("--repo", type=Path, default=Path(), metavar="DIR")
    new = sub.add_parser(
        "new-stage",
        help="scaffold a new stage: spec, evidence stubs, changelog and package",
        description="Write specs/NAME.toml, specs/NAME/ (float64 reference, oracle "
        "driver, acceptance test, CHANGELOG.md) and packages/NAME/ (pyproject, src "
        "with py.typed, tests/), the stage depending on --after and its dependencies.",
    )
    new.add_argument("name", help="the new stage's id (a Python identifier, lower case)")
    new.add_argument("--after", required=True, metavar="STAGE", help="the stage it builds on")
    new.add_argument("--repo", type=Path, default=Path(), metavar="DIR")


def run(args: argparse.Namespace) -> int:
    """Carry out a ``spec`` or ``new-stage`` command; errors print and exit 2."""
    try:
        if args.command == "new-stage":
            return _new_stage(args)
        return _api(args)
    except (ConfigError, SpecErrors) as err:
        sys.stderr.write(f"contracts: error: {err}\n")
        return EXIT_ERROR


def _api(args: argparse.Namespace) -> int:
    from niels_gpt_contracts.authoring import freeze  # griffe, loaded only when asked for

    stage = args.freeze or args.check
    repo = GitRepo.discover(args.repo)
    specs = load_specs(WorkingTree(repo))
    if stage not in specs:
        raise ConfigError(f"expected a stage among {sorted(specs)}, found {stage!r}")
    spec = specs[stage]
    needed = {m for s in specs.values() for m in freeze.needed_modules(s)}
    source = freeze.load(repo.root, specs, needed)
    frozen = freeze.freeze(source, spec, everything=args.all)
    if args.freeze:
        sys.stdout.write(freeze.to_toml(frozen))
        return EXIT_KEPT
    found = freeze.differences(spec.api, frozen)
    for line in found:
        sys.stdout.write(f"  {line}\n")
    if found:
        sys.stdout.write(
            f"BROKEN: specs/{stage}.toml's [[api]] differs from its code in {len(found)} "
            f"place(s); `contracts spec api --freeze {stage}` prints the code's\n"
        )
        return EXIT_BROKEN
    sys.stdout.write(f"KEPT: specs/{stage}.toml's {len(frozen)} [[api]] entries are its code's\n")
    return EXIT_KEPT


def _new_stage(args: argparse.Namespace) -> int:
    from niels_gpt_contracts.authoring import scaffold  # griffe, loaded only when asked for

    repo = GitRepo.discover(args.repo)
    written = scaffold.new_stage(repo.root, args.name, args.after)
    for path in written:
        sys.stdout.write(f"wrote {path}\n")
    sys.stdout.write(
        f"next: fill in specs/{args.name}.toml's title, invariants and API, commit the spec "
        f"side with a 'Spec: {args.name}' trailer, then the package with 'Stage: {args.name}'\n"
    )
    return EXIT_KEPT
