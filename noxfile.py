"""nox sessions for the niels_gpt monorepo.

    nox -s lint typecheck test-cpu test-mps     # what CI runs (see README)
    nox -s contracts                            # the spec gate on the working tree
    nox -s contracts -- --stage rope --base origin/main
    nox -s build                                # a wheel per package into dist/

Every session that needs torch shares one development environment
(``.nox/_shared-dev``), built once with ``-c constraints.txt`` and rebuilt only
when the constraints, a ``pyproject.toml`` or the tool list change. That keeps
CI from installing torch once per session. ``build`` has its own small venv.

A ``test-<device>`` session first probes its device by computing on it
(``niels_gpt_contracts.device_probe``: allocate, matmul + softmax, compare with
the CPU, in a subprocess with a time limit), because a driver that reports the
device available can still fail the first allocation. An absent or broken
device skips the session with one line naming what failed and exits 0, unless
``NIELS_GPT_REQUIRE_DEVICE`` names it (``mps``, ``cuda``, a comma-separated
list, or ``1`` for any): then the session fails with that line.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path

import nox

# nox puts this folder on sys.path only by changing into it; say so outright.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from noxkit.checker_tests import contracts_tests
from noxkit.devenv import dev_env, run_dev, run_gate
from noxkit.devices import device_tests
from noxkit.paths import (
    CONSTRAINTS,
    CONTRACTS,
    DEV_ENV,
    EXPERIMENTS,
    PACKAGES,
    REPORTS,
    ROOT,
    SERVE,
    bin_dir,
)
from noxkit.wheels import build_wheels, wheel_venv


class _NoUvNotice(logging.Filter):
    """Drop nox's 'uv binary not found.': these sessions never use uv."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != "uv binary not found."


logging.getLogger("nox").addFilter(_NoUvNotice())

nox.options.reuse_venv = "yes"
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "typecheck", "test-cpu", "test-mps", "contracts"]

# --- device test sessions ---------------------------------------------------


@nox.session(name="test-cpu", venv_backend="none")
def test_cpu(session: nox.Session) -> None:
    """Every stage's tests on the CPU (posargs go to pytest)."""
    device_tests(session, "cpu")


@nox.session(name="test-mps", venv_backend="none")
def test_mps(session: nox.Session) -> None:
    """Every stage's tests on Apple MPS; skips in one line where there is none."""
    device_tests(session, "mps")


@nox.session(name="test-cuda", venv_backend="none")
def test_cuda(session: nox.Session) -> None:
    """Every stage's tests on CUDA; skips in one line where there is none."""
    device_tests(session, "cuda")


# --- quality sessions --------------------------------------------------------


@nox.session(venv_backend="none")
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, the checker's import layers, and the
    GitHub workflows against GitHub's workflow schema (vendored by check-jsonschema)."""
    run_dev(session, "ruff", "check", ".", *session.posargs)
    run_dev(session, "ruff", "format", "--check", ".")
    # import-linter reads the experiment, the app and the benchmarks from their
    # source folders (the shared dev env installs only the stages and the checker).
    sources = os.pathsep.join(str(p) for p in (EXPERIMENTS / "src", SERVE / "src", ROOT))
    run_dev(
        session,
        *("lint-imports", "--no-logo", "--config", str(ROOT / "pyproject.toml")),
        extra_env={"PYTHONPATH": sources},
    )
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.y*ml"))
    run_dev(session, "check-jsonschema", "--builtin-schema", "vendor.github-workflows", *workflows)


@nox.session(venv_backend="none")
def typecheck(session: nox.Session) -> None:
    """mypy --strict over every package's sources, the checker, experiments, serve, the drivers.

    Packages are found, not listed (see PACKAGES); a stage's drivers in
    specs/<stage>/ are checked once its package exists, the spec kit
    (specs/_kit/) whenever it is there.
    """
    sources = [str(p / "src") for p in PACKAGES]
    # a stage's spec folder with Python in it (core's holds only its CHANGELOG.md)
    drivers = [str(d) for d in (ROOT / "specs" / p.name for p in PACKAGES) if any(d.rglob("*.py"))]
    drivers += [str(kit) for kit in [ROOT / "specs" / "_kit"] if kit.is_dir()]  # the spec kit
    env = dev_env(session)
    others = [str(CONTRACTS / "src"), str(ROOT / "experiments" / "src"), str(ROOT / "tests")]
    others += [str(SERVE / "src"), str(ROOT / ".ci" / "schedule.py")]
    # drivers import the kit and their stage's helpers by name (specs/_kit/speckit's docstring)
    env["MYPYPATH"] = os.pathsep.join([*sources, *others, *drivers])
    files = session.posargs or [*sources, *others, *drivers]
    session.run(str(bin_dir(DEV_ENV) / "mypy"), *files, env=env, external=True)


@nox.session(name="test-contracts", venv_backend="none")
def test_contracts(session: nox.Session) -> None:
    """The checker's own tests, on real temporary git repositories."""
    contracts_tests(
        session, "not hooks and not workflow and not scenario and not reseeded and not breadth"
    )


@nox.session(name="test-reseeded", venv_backend="none")
def test_reseeded(session: nox.Session) -> None:
    """Each float64 reference in depth: at a seed drawn for this run (``reseeded``), and
    against every wrong stage of its test file (``breadth``).

    ``test-contracts`` holds every reference to main at seed 7 and to one wrong
    stage each; these add one fresh seed a run, as the gate draws a secret one
    a verdict, and the other wrong stages (about 20, two oracle workers each).
    A failure of a drawn seed prints the seed and the ``NIELS_REFERENCE_SEED``
    value that reruns it. Only ``.ci/run --full`` runs them.
    """
    contracts_tests(session, "reseeded or breadth")


@nox.session(name="test-scenarios", venv_backend="none")
def test_scenarios(session: nox.Session) -> None:
    """Attacks and controls judged by whole verdicts with torch in the sandbox (``scenario``).

    Most build a scratch repository of the real stages, commit an attack (or
    an honest change) and ask for a whole ``contracts pr`` verdict, oracle
    included: one to three CPU-minutes each. The rest are the toy monorepo's
    torch attacks (fused attention reached at run time, a lazy import of the
    fast path), its environment seal, and two verdicts sharing a cold cache
    that build a real sandbox environment. 60 tests (43 of them took 48
    minutes and 97 CPU-minutes in one quiet run on two cores), so neither
    ``test-contracts`` nor a landing ``.ci/run`` runs them; ``.ci/run --full``
    does. ``-- -m smoke`` picks 5 for about three minutes: a first
    PR against the float64 reference, a foreign write on the real stages, the
    environment seal both ways and a loosened kv_cache test, the one whole
    verdict there that runs its stage's mutants. Run them all before changing
    the oracle, the sandbox or the source rules.
    """
    contracts_tests(session, "scenario")


@nox.session(name="test-workflow", venv_backend="none")
def test_workflow(session: nox.Session) -> None:
    """``.github/workflows/contracts.yml`` replayed step by step (``workflow`` marker).

    The checker installed with the workflow's own line into a fresh venv, the
    sandbox environment built and cached by the push job, then honest, broken
    and trailer-less PRs judged by the PR jobs (``contracts/tests/actkit.py``).
    """
    contracts_tests(session, "workflow", parallel=False)


@nox.session(name="test-hooks", venv_backend="none")
def test_hooks(session: nox.Session) -> None:
    """The pre-commit hooks through pre-commit itself (``hooks`` marker).

    Kept out of ``test-contracts``: pre-commit builds each hook environment
    from the package index (tens of seconds, and the network), while
    ``test-contracts`` stays fast and offline.
    """
    contracts_tests(session, "hooks")


@nox.session(venv_backend="none")
def contracts(session: nox.Session) -> None:
    """The spec gate: no posargs checks every stage; ``-- --stage S --base REV`` gates a PR."""
    run_gate(session, "check", *(session.posargs or ["--reports", str(REPORTS)]))


@nox.session(name="pr", venv_backend="none")
def pr_verdict(session: nox.Session) -> None:
    """The PR verdict CI gives, on your branch: ``nox -s pr -- --base origin/main``.

    Runs ``contracts pr`` (the checker of this checkout, the sandbox interpreter
    of the shared dev environment, so nothing is built); CI runs the same command
    from a checker installed from the base, with an interpreter built from the
    base's constraints. ``--head`` defaults to the working tree.
    """
    python = str(bin_dir(DEV_ENV) / "python")
    args = list(session.posargs) or ["--base", "origin/main"]
    cache = str(ROOT / ".contracts-cache")
    run_gate(session, "pr", "--python", python, "--cache-dir", cache, *args)


@nox.session(venv_backend="none")
def bench(session: nox.Session) -> None:
    """Side-by-side benchmarks: ``-- --device cuda``, ``--quick``, ``--no-compile``, ``--write``.

    Prints every figure beside its reference, with a progress line per step;
    writes benchmarks/results/ (JSON, table, tokens/s plot) and the README's
    bench section only with ``-- --write``.
    """
    args = list(session.posargs)
    if not any(a == "--device" or a.startswith("--device=") for a in args):
        args = ["--device", "cpu", *args]
    run_dev(session, "python", "-m", "benchmarks.run", *args)


@nox.session(venv_backend="none")
def mutants(session: nox.Session) -> None:
    """The mutant gate: every catalogued bug must be killed (``-- --stage S``, ``--all``,
    ``--write-hints`` to refresh ``specs/mutant-hints.json``)."""
    run_gate(session, "mutants", *session.posargs)


@nox.session
def build(session: nox.Session) -> None:
    """One wheel per package (stages, checker, experiments, the app) into dist/.

    The same wheels the test sessions install (``build_wheels``): built once
    for a source tree, then copied.
    """
    dist = ROOT / "dist"
    dist.mkdir(exist_ok=True)
    for wheel in sorted(build_wheels(session).glob("*.whl")):
        shutil.copy2(wheel, dist / wheel.name)
    session.log(f"wheels in {dist}")


@nox.session(name="test-readmes")
def test_readmes(session: nox.Session) -> None:
    """Every README's examples, in order, from the wheels its own install lines bring.

    Builds the wheels, then runs ``tests/test_readmes.py`` from the shared dev
    environment: a fresh venv a README section (torch seeded, see
    ``tests/readme_env.py``), the section's ``pip install`` line against those
    wheels, its Python blocks in order. The same ``tests/`` folder checks the
    docs' other promises in seconds: versions that agree with the packaging
    files, and a ``bench --quick`` that writes nothing tracked with sane
    figures. Posargs go to pytest.
    """
    wheels = build_wheels(session)
    env = {**dev_env(session), "NIELS_GPT_WHEELS": str(wheels)}
    session.run(
        str(bin_dir(DEV_ENV) / "pytest"), str(ROOT / "tests"), "-p", "no:cacheprovider",
        "--numprocesses=auto", *session.posargs, env=env, external=True,
    )  # fmt: skip


# --- the downstream experiment ------------------------------------------------


@nox.session(name="test-experiments")
def test_experiments(session: nox.Session) -> None:
    """The experiment as a user gets it: wheels built here, a fresh venv, no source tree.

    Builds a wheel of every stage, of the checker (its pytest plugin gives the
    tests ``--device``), of ``experiments/`` and of the app (``build_wheels``); installs them with
    ``-c constraints.txt`` into a new venv; checks that every import resolves
    to that venv; runs the experiment's tests there (the 2-process gloo ones
    included) and ``niels-train --quick`` and ``niels-ablate --quick``;
    checks in a second venv that the rope, attention and fastpath wheels alone,
    rope uninstalled, leave the other two typed (``typed_two_stages.py``,
    ``mypy --strict``); runs ``experiments/examples/typed_stages.py`` there and checks it with
    ``mypy --strict`` against the installed wheels. Posargs go to pytest.
    One intra-op thread: the models are tiny and the machine is shared, where
    spinning OpenMP threads only cost time.
    """
    session.install("-c", str(CONSTRAINTS), "build", "hatchling", "mypy")
    tmp = Path(session.create_tmp()) / "experiments"
    shutil.rmtree(tmp, ignore_errors=True)
    wheels, venv, work = build_wheels(session), tmp / "venv", tmp / "work"
    python, env = wheel_venv(session, venv, wheels, "niels-gpt-experiments[test,plot]")
    scripts = bin_dir(venv)
    probe = (
        "import sys, torch, niels_gpt.model.gpt as g, niels_gpt.model.block_v0 as b, "
        "niels_gpt_experiments as e\n"
        "paths = [g.__file__, b.__file__, e.__file__]\n"
        "outside = [p for p in paths if not p.startswith(sys.prefix)]\n"
        "assert not outside, f'imported from the source tree, not the wheels: {outside}'\n"
        "print(f'wheels in {sys.prefix}: torch {torch.__version__}, cuda {torch.version.cuda}')\n"
    )
    session.run(python, "-c", probe, env=env, external=True)
    # A typed user script: run it, then type-check it against the wheels in the
    # venv (their py.typed markers, the overloads of forward). The config file
    # is experiments/pyproject.toml, which has no [tool.mypy]: the root one's
    # mypy_path would point mypy at the source trees instead of the wheels.
    typed = str(EXPERIMENTS / "examples" / "typed_stages.py")
    session.run(python, typed, env=env, external=True)
    session.run(
        "mypy", "--strict", "--config-file", str(EXPERIMENTS / "pyproject.toml"),
        "--python-executable", python, "--cache-dir", str(tmp.parent / "mypy-cache"), typed,
    )  # fmt: skip
    # PEP 561 per stage: three stage wheels alone, one uninstalled, the other two typed.
    three = tmp / "three"
    session.run(sys.executable, "-m", "venv", "--without-pip", str(three), external=True)
    python3 = str(bin_dir(three) / "python")
    session.run(
        "python", "-m", "pip", "--python", python3, "install", "--quiet", "--no-compile",
        "-c", str(CONSTRAINTS), "torch",
    )  # fmt: skip
    session.run(
        "python", "-m", "pip", "--python", python3, "install", "--quiet", "--no-deps",
        "--find-links", str(wheels), "niels-gpt-rope", "niels-gpt-attention", "niels-gpt-fastpath",
    )  # fmt: skip
    session.run("python", "-m", "pip", "--python", python3, "uninstall", "--yes", "niels-gpt-rope")
    session.run(
        "mypy", "--strict", "--config-file", str(EXPERIMENTS / "pyproject.toml"),
        "--python-executable", python3, "--cache-dir", str(tmp.parent / "mypy-cache-three"),
        str(EXPERIMENTS / "examples" / "typed_two_stages.py"),
    )  # fmt: skip
    session.run(
        python, "-m", "pytest", "-c", str(EXPERIMENTS / "pyproject.toml"),
        f"--rootdir={EXPERIMENTS}", str(EXPERIMENTS / "tests"), "-p", "no:cacheprovider",
        *session.posargs, env=env, external=True,
    )  # fmt: skip
    data = str(work / "data")
    session.run(
        str(scripts / "niels-train"), "--quick", "--out", str(work / "train"), "--data-dir", data,
        "--device", "cpu", env=env, external=True,
    )  # fmt: skip
    session.run(
        str(scripts / "niels-ablate"), "--quick", "--out", str(work / "ablate"), "--data-dir", data,
        env=env, external=True,
    )  # fmt: skip


# --- peers nobody here wrote ---------------------------------------------------


@nox.session(name="test-peers")
def test_peers(session: nox.Session) -> None:
    """Our weights in another project's model: Hugging Face's ``LlamaForCausalLM``.

    Builds the wheels, installs the stages (``niels-gpt-kv-cache`` brings the
    GPT) with ``transformers``, pytest and constraints into a new venv, and runs
    ``peers/``: logits in float64 to round-off and greedy generation through
    each side's KV cache, token for token, with fewer key/value heads than
    query heads (grouped-query attention) and without. Not in the landing
    run (``.ci/run --full`` has it): it installs transformers. Posargs go to pytest.
    """
    tmp = Path(session.create_tmp()) / "peers"
    shutil.rmtree(tmp, ignore_errors=True)
    wheels = build_wheels(session)
    python, env = wheel_venv(session, tmp / "venv", wheels, "niels-gpt-kv-cache")
    session.run(
        "python", "-m", "pip", "--python", python, "install", "--quiet", "--no-compile",
        "-c", str(CONSTRAINTS), "transformers", "pytest",
    )  # fmt: skip
    session.run(
        python, "-m", "pytest", "-c", str(ROOT / "pyproject.toml"), f"--rootdir={ROOT}",
        "--noconftest", str(ROOT / "peers"), "-p", "no:cacheprovider", *session.posargs,
        env=env, external=True,
    )  # fmt: skip


# --- the web app ----------------------------------------------------------------


@nox.session(name="test-serve")
def test_serve(session: nox.Session) -> None:
    """The app as a user gets it: wheels built here, a fresh venv, no source tree.

    Builds the wheels (``build_wheels``: every stage, ``experiments/``, ``serve/``);
    installs ``niels-gpt-serve[test]`` with ``-c constraints.txt`` into a new
    venv; checks that every import resolves to that venv; runs the app's tests
    there: the API in-process, batching, disconnects, the command line, a
    32-client load test and the page in Debian's headless chromium (which
    ``.ci/run`` installs; where it is missing the browser test fails with the
    line that installs it). Posargs go to pytest. One intra-op thread, as in
    test-experiments: the test model is tiny and the machine shared.
    """
    tmp = Path(session.create_tmp()) / "serve"
    shutil.rmtree(tmp, ignore_errors=True)
    wheels = build_wheels(session)
    python, env = wheel_venv(session, tmp / "venv", wheels, "niels-gpt-serve[test]")
    probe = (
        "import sys, niels_gpt.model.padding as p, niels_gpt_experiments.loading as e, "
        "niels_gpt_serve as s\n"
        "outside = [m.__file__ for m in (p, e, s) if not m.__file__.startswith(sys.prefix)]\n"
        "assert not outside, f'imported from the source tree, not the wheels: {outside}'\n"
    )
    session.run(python, "-c", probe, env=env, external=True)
    session.run(
        python, "-m", "pytest", "-c", str(SERVE / "pyproject.toml"), f"--rootdir={SERVE}",
        str(SERVE / "tests"), "-p", "no:cacheprovider", *session.posargs, env=env, external=True,
    )  # fmt: skip


@nox.session(name="serve")
def serve(session: nox.Session) -> None:
    """The page: wheels built here, ``niels-gpt-serve`` installed in this session's venv,
    then ``niels-serve`` (posargs go to it: ``nox -s serve -- --port 8000``).

    The venv (``.nox/serve``) is kept between runs; this checkout's wheels are
    reinstalled every time, so it serves the code you have. Without ``--checkpoint``
    or ``--demo`` it serves the newest run under ``runs/``, or with none the demo
    model shipped in the package, at once (``--demo`` trains that preset, minutes).
    """
    wheels = build_wheels(session)
    # Not silent: the first install fetches torch and the rest for minutes, and a user
    # should see pip working (it was 5 to 6 silent minutes).
    session.install(
        "-c", str(CONSTRAINTS), "--find-links", str(wheels), "niels-gpt-serve", silent=False
    )  # fmt: skip
    ours = [str(w) for w in sorted(wheels.glob("*.whl")) if "contracts" not in w.name]
    session.install("--no-deps", "--force-reinstall", "--quiet", *ours)
    session.run("niels-serve", *session.posargs)
