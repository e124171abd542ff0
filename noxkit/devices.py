"""The device test sessions' parts: probe a device by computing on it, skip or fail in one line.

See noxfile.py's docstring for the contract: an absent or broken device skips
its session in one line, unless ``NIELS_GPT_REQUIRE_DEVICE`` names it.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess

import nox

from noxkit.devenv import dev_env, run_dev
from noxkit.paths import DEV_ENV, REPORTS, ROOT, bin_dir

REQUIRE_DEVICE_VAR = "NIELS_GPT_REQUIRE_DEVICE"


def _platform_can_have(kind: str) -> tuple[bool, str]:
    """Cheap check without torch, so an absent device skips before any install."""
    system, machine = platform.system(), platform.machine()
    if kind == "mps" and not (system == "Darwin" and machine == "arm64"):
        return False, f"MPS needs macOS on Apple silicon; this is {system} {machine}"
    if kind == "cuda" and system != "Windows" and shutil.which("nvidia-smi") is None:
        return False, "no NVIDIA driver found (nvidia-smi is not on PATH)"
    return True, ""


def _device_required(kind: str) -> bool:
    wanted = {v.strip().lower() for v in os.environ.get(REQUIRE_DEVICE_VAR, "").split(",")}
    return kind in wanted or "1" in wanted


def _absent(session: nox.Session, kind: str, why: str) -> None:
    if _device_required(kind):
        session.error(f"{kind} is required ({REQUIRE_DEVICE_VAR}) but not usable here: {why}")
    session.skip(f"{kind} not usable here, tests not run: {why}")


def _probe(session: nox.Session, kind: str) -> tuple[bool, str]:
    """Usable or not, and why: the contracts device probe, in the dev environment."""
    env = dev_env(session)
    python = str(bin_dir(DEV_ENV) / "python")
    out = subprocess.run(
        [python, "-m", "niels_gpt_contracts.device_probe", kind],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        check=False,
    )
    lines = out.stdout.strip().splitlines()
    if out.returncode not in (0, 1) or not lines:
        tail = out.stderr.strip().splitlines()[-1:] or ["no output"]
        session.error(f"the {kind} probe could not run (exit status {out.returncode}): {tail[0]}")
    line = lines[-1]
    if out.returncode == 0:
        return True, line
    return False, line.removeprefix(f"{kind}: unusable: ")


def acceptance_dirs() -> list[str]:
    """``specs/<stage>/tests`` of every stage whose package exists.

    The maintainers' acceptance tests land with a new stage's spec, before the
    stage's first PR; until its package is there they have nothing to test.
    """
    return sorted(
        str(tests.relative_to(ROOT))
        for tests in (ROOT / "specs").glob("*/tests")
        if (ROOT / "packages" / tests.parent.name).is_dir()
    )


# The READMEs' Python examples, run as tests once, on the CPU (pytest-codeblocks;
# ``packages`` brings each stage's README). Shell blocks are install and nox
# commands: the root conftest deselects them.
# experiments/README.md is left to test-readmes: its examples import the
# experiment, which the shared dev environment does not install.
README_EXAMPLES = ("--codeblocks", "README.md")


def device_tests(session: nox.Session, kind: str) -> None:
    if kind != "cpu":
        present, why = _platform_can_have(kind)  # no environment to build where it cannot be
        if present:
            present, why = _probe(session, kind)
        if not present:
            _absent(session, kind, why)
        session.log(f"device probe: {why}")
    REPORTS.mkdir(exist_ok=True)
    run_dev(
        session,
        "pytest",
        "packages",
        *acceptance_dirs(),
        f"--device={kind}",
        "--numprocesses=auto",
        f"--invariant-report={REPORTS / f'invariants-{kind}.json'}",
        "--invariant-report-merge",  # a narrowed run (-k rope) adds to the report
        *(README_EXAMPLES if kind == "cpu" else ()),
        *session.posargs,
    )
