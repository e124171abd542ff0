"""Fresh environments for README walks, and running a walk's blocks in one.

Each walk gets a new venv that holds only what its install line brings, with
one exception said here once: **torch comes from a seed**. Installing torch
costs 30-60 s a venv, and the README's PyTorch CPU index is out of reach of a
test; so ``link_seed`` links torch and its own requirements (sympy, networkx,
jinja2, ...; numpy is not one of them) from the interpreter running the tests
into a folder that a ``.pth`` file puts on each venv's path. pip sees those
distributions as installed and satisfies ``torch`` from them; everything else,
numpy and every niels-gpt stage included, must come from the install line.
"""

from __future__ import annotations

import importlib.metadata as md
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from readme_walk import Install, Step

__all__ = [
    "SEED_ROOTS",
    "WARNING",
    "check_brings",
    "installed",
    "link_seed",
    "make_venv",
    "pip_install",
    "run_step",
]

SEED_ROOTS = ("torch",)
# A Python warning as printed ("...: UserWarning: ...", torch's "Failed to initialize NumPy").
WARNING = re.compile(r"\b[A-Z]\w*Warning: ")


def _closure(roots: tuple[str, ...]) -> list[md.Distribution]:
    """``roots`` and every installed requirement they need here, each once."""
    seen: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = canonicalize_name(todo.pop())
        if name in seen:
            continue
        dist = md.distribution(name)
        seen[name] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return list(seen.values())


def link_seed(dest: Path, roots: tuple[str, ...] = SEED_ROOTS) -> list[str]:
    """Symlink the top-level entries of ``roots``' distributions into ``dest``.

    Returns:
        The linked distributions as ``name==version``.
    """
    dest.mkdir(parents=True, exist_ok=True)
    linked = []
    for dist in _closure(roots):
        tops = {Path(str(f)).parts[0] for f in dist.files or [] if not str(f).startswith("..")}
        for top in sorted(tops - {"__pycache__"}):
            if top.endswith(".pth") or (dest / top).exists():
                continue
            (dest / top).symlink_to(Path(str(dist.locate_file(top))))
        linked.append(f"{dist.metadata['Name']}=={dist.version}")
    return sorted(linked)


def make_venv(path: Path, seed: Path) -> Path:
    """A venv without pip whose path also holds ``seed``; returns its interpreter."""
    venv.EnvBuilder(with_pip=False, clear=True, symlinks=os.name != "nt").create(path)
    python = path / ("Scripts/python.exe" if sys.platform == "win32" else "bin/python")
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    Path(purelib, "_readme_seed.pth").write_text(f"{seed}\n")
    return python


def pip_install(python: Path, install: Install, *, wheels: Path, constraints: Path) -> None:
    """Run the install line into ``python``'s venv with this interpreter's pip.

    ``dist`` is ``wheels`` and ``constraints.txt`` is ``constraints``; an
    ``--extra-index-url`` was dropped by the parser (torch is seeded).

    Raises:
        AssertionError: pip failed; the message holds its last lines.
    """
    cmd = [sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet"]
    cmd += ["--no-compile", "--disable-pip-version-check"]
    cmd += ["-c", str(constraints)] if install.constraints else []
    cmd += ["--find-links", str(wheels)] if install.find_links else []
    out = subprocess.run([*cmd, *install.requirements], capture_output=True, text=True)
    if out.returncode:
        tail = [ln for ln in out.stderr.splitlines() if not ln.startswith("WARNING: Location")]
        raise AssertionError(
            f"pip install {' '.join(install.requirements)} failed ({out.returncode}):\n"
            + "\n".join(tail[-15:])
        )


def installed(python: Path) -> set[str]:
    """Canonical names of every distribution ``python`` sees (the seed's included)."""
    code = "import importlib.metadata as m; print(*{d.metadata['Name'] for d in m.distributions()})"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return {canonicalize_name(n) for n in out.stdout.split()}


def check_brings(python: Path, install: Install, stages: set[str]) -> None:
    """What the install line's comment says it brings is what it brought.

    An item that is a stage (``kv-cache``) means ``niels-gpt-kv-cache``; any
    other (``numpy``) a distribution of that name. The niels-gpt distributions
    in the venv must be the requested ones plus the named stages, no more.

    Raises:
        AssertionError: an item not installed, or a stage installed but not named.
    """
    if install.brings is None:
        return
    have = installed(python)
    named = {
        canonicalize_name(f"niels-gpt-{i}" if f"niels-gpt-{i}" in stages else i)
        for i in install.brings
    }
    asked = {canonicalize_name(Requirement(r).name) for r in install.requirements}
    absent = sorted(named - have)
    unnamed = sorted({d for d in have if d.startswith("niels-gpt-")} - named - asked)
    if absent or unnamed:
        raise AssertionError(
            f"install of {', '.join(sorted(asked))} says it brings {', '.join(install.brings)}; "
            f"not installed: {absent or 'none'}; installed but not said: {unnamed or 'none'}"
        )


def run_step(step: Step, python: Path, cwd: Path, env: dict[str, str]) -> None:
    """Run one block in ``cwd`` with the venv's interpreter (bash: its ``bin`` first on PATH).

    Raises:
        AssertionError: a non-zero exit or a warning on stderr; the message
            names the block's line and shows the end of its output.
    """
    script = cwd / f"block-{step.line}.{'py' if step.syntax == 'python' else 'sh'}"
    script.write_text(step.code)
    bin_dir = str(python.parent)
    run_env = {**env, "PATH": os.pathsep.join((bin_dir, env.get("PATH", "")))}
    run_env["VIRTUAL_ENV"] = str(python.parent.parent)
    cmd = [str(python), script.name] if step.syntax == "python" else ["bash", "-eo", "pipefail"]
    if step.syntax != "python":
        cmd.append(script.name)
    out = subprocess.run(cmd, cwd=cwd, env=run_env, capture_output=True, text=True)
    shown = "\n".join((out.stdout + out.stderr).splitlines()[-20:])
    if out.returncode:
        raise AssertionError(f"block at line {step.line} exited {out.returncode}:\n{shown}")
    warned = [ln for ln in out.stderr.splitlines() if WARNING.search(ln)]
    if warned:
        raise AssertionError(f"block at line {step.line} warned: {warned[0]}")
