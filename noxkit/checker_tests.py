"""The checker's own test sessions: pytest over ``contracts/tests`` by marker."""

from __future__ import annotations

import nox

from noxkit.devenv import run_dev


def contracts_tests(session: nox.Session, marker: str, *, parallel: bool = True) -> None:
    """pytest over ``contracts/tests`` selected by ``-m marker``, plus the session's arguments.

    ``--confcutdir=contracts`` keeps the repository-wide conftest (hypothesis
    profiles, torch) out of these torch-free tests: it costs seconds a worker.
    ``parallel``: one pytest-xdist worker a core (the workflow replay runs alone).
    """
    workers = ["--numprocesses=auto"] if parallel else []
    run_dev(
        session,
        "pytest",
        "contracts/tests",
        "--confcutdir=contracts",
        "--durations=12",  # where the minutes go, in every CI log
        *workers,
        "-m",
        marker,
        *session.posargs,
    )
