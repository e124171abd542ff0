"""Wheels built once per source tree, and bare venvs that install them, for the wheel sessions."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import nox

from noxkit.paths import CONSTRAINTS, CONTRACTS, EXPERIMENTS, PACKAGES, ROOT, SERVE, bin_dir

PROJECTS = (*PACKAGES, CONTRACTS, EXPERIMENTS, SERVE)
WHEELHOUSE = ROOT / ".nox" / "_wheelhouse"


def _sources_fingerprint() -> str:
    """Hash of every file a wheel may be built from: what git tracks or would track
    (untracked but not ignored) under each project, by path and content."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--",
         *(str(p.relative_to(ROOT)) for p in PROJECTS)],
        cwd=ROOT, capture_output=True, check=True,
    ).stdout.decode().split("\0")  # fmt: skip
    digest = hashlib.sha256(CONSTRAINTS.read_bytes())
    for rel in sorted(filter(None, listed)):
        path = ROOT / rel
        if path.is_file():  # listed but deleted in the working tree: not built from
            digest.update(rel.encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` (POSIX; elsewhere no lock: one session at a time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        if sys.platform != "win32":
            import fcntl

            fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def build_wheels(session: nox.Session) -> Path:
    """A wheel of every stage, the checker, the experiment and the app; their folder.

    Built once per source tree into ``.nox/_wheelhouse/<fingerprint>`` and reused
    by every session that installs them (test-experiments, test-serve,
    test-readmes, serve, build): the fingerprint covers every file git would
    build from and the constraints, so an edit rebuilds. Sessions that start
    together wait on a lock for one build. Older folders are removed.
    """
    wanted = _sources_fingerprint()
    out = WHEELHOUSE / wanted[:16]
    with _locked(WHEELHOUSE / ".lock"):
        if (out / "complete").is_file():
            session.log(f"wheels of this tree already built: {out}")
            return out
        for old in WHEELHOUSE.iterdir():
            if old.is_dir():
                shutil.rmtree(old, ignore_errors=True)
        session.install("-c", str(CONSTRAINTS), "build", "hatchling")
        for project in PROJECTS:
            session.run(
                "python", "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
                str(project), silent=True,
            )  # fmt: skip
        (out / "complete").write_text(wanted)
    return out


def wheel_venv(
    session: nox.Session, venv: Path, wheels: Path, requirement: str
) -> tuple[str, dict[str, str]]:
    """A bare venv at ``venv``, ``requirement`` installed from ``wheels`` with constraints.

    No ensurepip and no byte-compiling of torch's thousands of modules: the
    session's own pip installs into it (``--python``). Returns the venv's
    ``python`` and the environment to run it in (its ``bin`` first on ``PATH``,
    one intra-op thread: the models are tiny and the machine shared).
    """
    session.run(sys.executable, "-m", "venv", "--without-pip", str(venv), external=True)
    executables = bin_dir(venv)
    python = str(executables / "python")
    session.run(
        "python", "-m", "pip", "--python", python, "install", "--quiet", "--no-compile",
        "-c", str(CONSTRAINTS), "--find-links", str(wheels), requirement,
    )  # fmt: skip
    env = {
        "PATH": os.pathsep.join((str(executables), os.environ.get("PATH", ""))),
        "VIRTUAL_ENV": str(venv),
        "OMP_NUM_THREADS": "1",
    }
    return python, env
