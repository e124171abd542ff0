"""The Python environment the PR's code runs in, and proof it was not changed.

``Sandbox`` holds the interpreter (given with ``--python`` or built by
``build``), a bootstrap folder (our ``sitecustomize`` and a copy of the
checker's own package, for its pytest plugin), and its scratch folder
(``root``). Its ``environ`` is built from an allowlist of the caller's
variables, so nothing like ``PYTEST_ADDOPTS``, ``PYTEST_PLUGINS``,
``PYTHONSTARTUP`` or git settings reaches a run, plugin autoloading is off and
user site-packages are ignored. ``scratch_vars`` puts ``HOME``, ``TMPDIR`` and
every cache location a run's tools pick for themselves (Hypothesis's
database, torch's compile and hub caches, triton's and CUDA's, pip's)
inside that folder, and no bytecode is written: nothing a run writes by
default lands where the verdict was started, in the user's home or
elsewhere in ``/tmp``.
Every process the verdict starts gets them; ``tmp`` is also where the checker
makes each run's working folder.

``Snapshot`` records every file and symbolic link on the interpreter's import
path (size, modification and change times); a run of the PR's code that adds,
removes or rewrites one of them (a ``.pth`` file dropped into site-packages, a
patched pytest, a linked folder) is found by comparing snapshots before and
after.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout

import niels_gpt_contracts
from niels_gpt_contracts.decoding import Malformed, decode, last_line
from niels_gpt_contracts.digests import Digest
from niels_gpt_contracts.errors import ConfigError

BOOTSTRAP_SITE = Path(__file__).with_name("_bootstrap_site.py")
# What the verdict's runs need in the environment; versions come from the
# base's constraints.txt.
TOOLS = ("torch", "numpy", "safetensors", "pytest", "pytest-xdist", "hypothesis")
# How long a verdict waits for another one building the same environment.
BUILD_WAIT_S = 1800.0
PASSED_THROUGH = (
    "PATH",
    "LANG",
    "LC_ALL",
    "LC_CTYPE",
    "TZ",
    "SYSTEMROOT",
    "CUDA_VISIBLE_DEVICES",
    "NVIDIA_VISIBLE_DEVICES",
)
# Where a run's tools write unless told otherwise: each variable names a folder
# under the sandbox's ``cache`` folder (``scratch_vars``).
CACHES = {
    "XDG_CACHE_HOME": "xdg",
    "XDG_CONFIG_HOME": "config",
    "XDG_DATA_HOME": "data",
    "XDG_STATE_HOME": "state",
    "HYPOTHESIS_STORAGE_DIRECTORY": "hypothesis",
    "TORCH_HOME": "torch",
    "TORCHINDUCTOR_CACHE_DIR": "torchinductor",
    "TRITON_CACHE_DIR": "triton",
    "CUDA_CACHE_PATH": "nv",
    "PIP_CACHE_DIR": "pip",
    "MPLCONFIGDIR": "matplotlib",
}


def scratch_vars(root: Path) -> dict[str, str]:
    """``HOME``, ``TMPDIR`` and every cache location (``CACHES``) inside ``root``.

    The folders are made here (a tool may expect them to exist); bytecode is
    not written at all (``PYTHONDONTWRITEBYTECODE``). No ``PYTHONPYCACHEPREFIX``:
    it would also move where bytecode is *read*, so every run would compile
    torch from source (a toy verdict's runs took twice as long); a write the
    flag misses lands on a path the guard watches or in the read-only mounts.
    """
    env = {"HOME": str(root / "home"), "TMPDIR": str(root / "tmp")}
    env.update({var: str(root / "cache" / name) for var, name in CACHES.items()})
    for var in ("HOME", "TMPDIR", *CACHES):
        Path(env[var]).mkdir(parents=True, exist_ok=True)
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


@dataclass
class Sandbox:
    """An interpreter and the folders every sandboxed run uses (all under ``root``)."""

    python: str
    boot: Path  # root/boot
    home: Path  # root/home
    names: tuple[str, ...]  # the stages' top-level packages, e.g. ("niels_gpt",)
    threads: int = 1
    readonly: Path | None = None  # confine.py's list of read-only paths, when confined

    @classmethod
    def prepare(cls, python: str, scratch: Path, names: Iterable[str], threads: int) -> Sandbox:
        """Write the bootstrap folder under ``scratch`` and check the interpreter runs."""
        boot, home = scratch / "boot", scratch / "home"
        home.mkdir(parents=True, exist_ok=True)
        shutil.copytree(
            Path(niels_gpt_contracts.__file__).parent,
            boot / "niels_gpt_contracts",
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        shutil.copyfile(BOOTSTRAP_SITE, boot / "sitecustomize.py")
        box = cls(python, boot, home, tuple(sorted(names)), threads)
        scratch_vars(box.root)
        found = box.site_paths()
        if not found:
            raise ConfigError(f"--python {python}: expected a working interpreter, found none")
        return box

    @property
    def root(self) -> Path:
        """The sandbox's scratch folder: the only place its runs may write."""
        return self.boot.parent

    @property
    def tmp(self) -> Path:
        """``TMPDIR`` of every run, and where the checker makes each run's folder."""
        return self.root / "tmp"

    def scratch_vars(self) -> dict[str, str]:
        """``HOME``, ``TMPDIR`` and the cache locations of every run (``scratch_vars``)."""
        return scratch_vars(self.root)

    def environ(
        self, paths: Iterable[Path], extra: Mapping[str, str] | None = None
    ) -> dict[str, str]:
        """Variables for one run whose importable code is ``paths`` (src roots)."""
        env = {k: os.environ[k] for k in PASSED_THROUGH if k in os.environ}
        env.update(self.scratch_vars())
        env.update(
            {
                "PYTHONPATH": os.pathsep.join([str(self.boot), *map(str, paths)]),
                "PYTHONNOUSERSITE": "1",
                "PYTHONSAFEPATH": "1",
                "PYTHONHASHSEED": "0",
                "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
                "NIELS_GPT_SANDBOX_NAMES": ",".join(self.names),
                "OMP_NUM_THREADS": str(self.threads),
                "MKL_NUM_THREADS": str(self.threads),
                "GIT_CONFIG_NOSYSTEM": "1",
            }
        )
        env.update(extra or {})
        return env

    def trusted_paths(self) -> list[str]:
        """What the PR's code must not change: the import path (``site_paths``), the
        environment's whole folder (interpreter, ``pyvenv.cfg``) and the real
        interpreter's folder."""
        env_root = Path(self.python).parent.parent
        real_bin = Path(os.path.realpath(self.python)).parent
        roots = [*self.site_paths(), *(str(p) for p in (env_root, real_bin) if p.is_dir())]
        # A folder inside another is scanned once, as part of the outer one.
        return [
            r
            for r in dict.fromkeys(roots)
            if not any(o != r and r.startswith(o.rstrip("/") + "/") for o in roots)
        ]

    def site_paths(self) -> list[str]:
        """The interpreter's import path outside the bootstrap (site-packages, stdlib).

        Entries that provide one of the stages' top-level names (an editable
        install of a checkout) are left out: the bootstrap drops them from every
        sandboxed interpreter, so they cannot influence a run.
        """
        code = "import json, sys; print(json.dumps([p for p in sys.path if p]))"
        try:
            done = subprocess.run(
                [self.python, "-I", "-c", code],
                cwd=self.home if self.home.is_dir() else None,
                capture_output=True,
                text=True,
                timeout=120,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired):
            return []
        if done.returncode != 0:
            return []
        try:
            paths = decode(last_line(done.stdout), list[str], "sys.path")
        except Malformed:
            return []
        return [
            p
            for p in paths
            if os.path.isdir(p) and not any(os.path.exists(os.path.join(p, n)) for n in self.names)
        ]


@dataclass
class Snapshot:
    """``path -> (size, mtime_ns, ctime_ns)`` of every file under some folders."""

    files: dict[str, tuple[int, int, int]] = field(default_factory=dict)

    @classmethod
    def take(cls, roots: Iterable[str | Path]) -> Snapshot:
        """Every file and symbolic link under ``roots``; links are recorded, never followed.

        A guard takes two of these a verdict over the interpreter's whole
        import path (tens of thousands of files): one ``scandir`` a folder and
        one ``lstat`` a file, nothing more.
        """
        files: dict[str, tuple[int, int, int]] = {}
        # __pycache__ included: a planted .pyc would run in every later process.
        folders = [os.fspath(root) for root in roots]
        while folders:
            try:
                entries = os.scandir(folders.pop())
            except OSError:
                continue
            with entries:
                for entry in entries:
                    try:
                        if entry.is_dir(follow_symlinks=False):
                            folders.append(entry.path)
                            continue
                        st = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    files[entry.path] = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        return cls(files)

    def changes(self, later: Snapshot) -> list[str]:
        """Files added, removed or rewritten since this snapshot, sorted."""
        added = later.files.keys() - self.files.keys()
        removed = self.files.keys() - later.files.keys()
        rewritten = {
            p for p in self.files.keys() & later.files.keys() if self.files[p] != later.files[p]
        }
        return sorted(added | removed | rewritten)


def fingerprint(constraints: str) -> str:
    """What decides a built environment's contents."""
    return Digest(sys.version, " ".join(TOOLS), constraints).hexdigest()[:16]


def build(cache: Path, constraints: str, say: Callable[[str], None]) -> str:
    """A virtual environment with ``TOOLS`` pinned by ``constraints``; its interpreter.

    Built once under ``cache/envs/<fingerprint>`` and reused while the
    constraints, the tool list and the Python version stay the same. pip runs
    with the caller's own configuration (index, proxy): only the tools are
    installed, never the PR's packages. Verdicts that share a cache build it
    once: the builder holds ``<fingerprint>.lock`` (a file lock) while it
    builds and writes the ready stamp last; the others wait for the lock,
    then find the stamp and reuse the environment. A build that died half way
    left no stamp, and the next one starts it again.

    Raises:
        ConfigError: the venv or the install failed, or another build held the
            lock longer than ``BUILD_WAIT_S``.
    """
    env_dir = cache / "envs" / fingerprint(constraints)
    bin_dir = env_dir / ("Scripts" if sys.platform == "win32" else "bin")
    python = bin_dir / ("python.exe" if sys.platform == "win32" else "python")
    stamp = env_dir / "niels-gpt-ready"
    if stamp.is_file() and python.exists():
        return str(python)
    env_dir.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(env_dir.parent / f"{env_dir.name}.lock")
    try:
        lock.acquire(timeout=0)
    except Timeout:
        say(f"waiting for another verdict building {env_dir}")
        try:
            lock.acquire(timeout=BUILD_WAIT_S)
        except Timeout as err:
            raise ConfigError(
                f"could not build the sandbox environment: expected the lock {lock.lock_file} "
                f"within {BUILD_WAIT_S:g} s, found it still held by another build"
            ) from err
    try:
        if not (stamp.is_file() and python.exists()):  # or built while we waited
            _build(env_dir, python, constraints, say)
            stamp.write_text(" ".join(TOOLS) + "\n", encoding="utf-8")
    finally:
        lock.release()
    return str(python)


def _build(env_dir: Path, python: Path, constraints: str, say: Callable[[str], None]) -> None:
    """Create ``env_dir`` afresh and install the tools (the caller holds the lock)."""
    say(f"building the sandbox environment {env_dir} (once per constraints file)")
    shutil.rmtree(env_dir, ignore_errors=True)
    pinned = env_dir.parent / f"{env_dir.name}-constraints.txt"
    pinned.write_text(constraints, encoding="utf-8")
    steps = (
        [sys.executable, "-m", "venv", str(env_dir)],
        [
            str(python),
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
            "-c",
            str(pinned),
            *TOOLS,
        ],
    )
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise ConfigError(
                f"could not build the sandbox environment ({' '.join(step[:4])} exited "
                f"{done.returncode}): {tail}"
            )
