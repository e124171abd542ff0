"""The shared development environment every torch session runs in, and the gate's runner.

``.nox/_shared-dev`` is built once with ``-c constraints.txt`` (the stages and
the checker editable, plus ``DEV_TOOLS``) and rebuilt only when what decides
its contents changes (``fingerprint``).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys

import nox

from noxkit.paths import CONSTRAINTS, CONTRACTS, DEV_ENV, PACKAGES, bin_dir

DEV_TOOLS = (
    "pytest",
    "pytest-xdist",
    "pytest-codeblocks",
    "hypothesis",
    "numpy",
    "mypy",
    "ruff",
    "import-linter",
    "matplotlib",
    "xmlschema",
    "pre-commit",
    "check-jsonschema",
    "PyYAML",  # test-workflow reads the workflow
    "markdown-it-py",  # test-readmes reads the READMEs' blocks
    "packaging",
    # serve/: the app's stack, for mypy over serve/src (its tests run from wheels)
    "fastapi",
    "uvicorn",
    "httpx",
    "prometheus-client",
)


def fingerprint() -> str:
    """Hash of everything that decides what the shared environment holds."""
    digest = hashlib.sha256()
    digest.update(sys.version.encode())
    digest.update(" ".join(DEV_TOOLS).encode())
    for path in (CONSTRAINTS, *(p / "pyproject.toml" for p in (*PACKAGES, CONTRACTS))):
        digest.update(path.read_bytes())
    return digest.hexdigest()


def dev_env(session: nox.Session) -> dict[str, str]:
    """Create or reuse the shared dev environment; return the variables to run in it."""
    executables = bin_dir(DEV_ENV)
    stamp = DEV_ENV / "niels-gpt-fingerprint"
    wanted = fingerprint()
    if not (stamp.is_file() and stamp.read_text() == wanted):
        # Not --quiet: pip's "Collecting ..." lines are the progress of a build
        # that takes one to two minutes (torch is most of it).
        session.log(
            f"building the shared dev environment in {DEV_ENV}: torch, the stages and "
            f"{len(DEV_TOOLS)} tools, about 1-2 minutes; pip's progress follows"
        )
        session.run(sys.executable, "-m", "venv", "--clear", str(DEV_ENV), external=True)
        editables = [arg for p in (*PACKAGES, CONTRACTS) for arg in ("-e", str(p))]
        session.run(
            str(executables / "python"),
            "-m",
            "pip",
            "install",
            "--progress-bar",
            "off",
            "-c",
            str(CONSTRAINTS),
            *editables,
            *DEV_TOOLS,
            external=True,
        )
        stamp.write_text(wanted)
    return {
        "PATH": os.pathsep.join((str(executables), os.environ.get("PATH", ""))),
        "VIRTUAL_ENV": str(DEV_ENV),
    }


def run_dev(session: nox.Session, *args: str, extra_env: dict[str, str] | None = None) -> None:
    """Run a command from the shared dev environment, with ``extra_env`` set beside its own."""
    env = {**dev_env(session), **(extra_env or {})}
    program = shutil.which(args[0], path=env["PATH"]) or args[0]
    session.run(program, *args[1:], env=env, external=True)


GATE_EXITS = {
    1: "contracts exited 1: BROKEN, a rule is broken (see above)",
    2: "contracts exited 2: a usage or configuration error; no verdict was given",
}


def run_gate(session: nox.Session, *args: str) -> None:
    """Run ``contracts`` and say which of its exit statuses it was.

    nox ends every failed session with status 1; the line printed here keeps
    contracts' own distinction (1 BROKEN, 2 no verdict) visible in the log.
    """
    env = dev_env(session)
    program = str(bin_dir(DEV_ENV) / "contracts")
    session.log(" ".join(["contracts", *args]))
    code = subprocess.run([program, *args], env={**os.environ, **env}, check=False).returncode
    if code:
        session.error(GATE_EXITS.get(code, f"contracts exited {code}: an unexpected status"))
