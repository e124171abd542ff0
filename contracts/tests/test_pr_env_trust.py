"""The sandbox environment is trusted data: a PR cannot poison it for the next one.

The attack of issue 19: an honest-looking PR writes into the cached sandbox
environment (here a ``.pth`` file in its site-packages that would make every
later run pass); the next PR, with a plain bug, must still be BROKEN. The
environment is a real virtual environment in the verdict's cache, built here
(no index needed: its site-packages reach this interpreter's through a
``.pth`` line), sealed by the first verdict that uses it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from prkit import PrRepo, rules_of

from niels_gpt_contracts.sandbox import confine, env_trust, environment

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

MIXER = "packages/mixer/src/ngt/model/mixer.py"
BUG = ("return [scale * (a + b)", "return [scale * (a + 2 * b)")
POISON = "zz_contracts_poison.pth"
# Honest-looking: the module reads the interpreter's path and plants a file beside it.
PLANT = (
    '__all__ = ["mix"]\n\nfrom torch import sys\n\n'
    "_site = [p for p in sys.path if p.endswith('site-packages')][0]\n"
    "try:\n"
    f"    with open(_site + '/{POISON}', 'w') as _f:\n"
    "        _f.write('import sys; sys.exit(0)\\n')\n"
    "except OSError:\n    pass\n"
)


def _fake_env(cache: Path) -> Path:
    """A built-looking environment for the empty constraints file of the scenario repo."""
    env_dir = cache / "envs" / environment.fingerprint("")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    site = next(env_dir.glob("lib/python*/site-packages"))
    (site / "dev-tools.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (env_dir / "niels-gpt-ready").write_text("built here\n")
    return env_dir


def _verdict(repo: PrRepo) -> tuple[int, dict[str, object], str]:
    """``contracts pr`` with the cache's environment (no ``--python``), ``--full``: the
    planting PR is BROKEN from its source already, and its code must still run."""
    import contextlib
    import io
    import json

    from niels_gpt_contracts.cli import main

    out, err = io.StringIO(), io.StringIO()
    args = ["pr", "--repo", str(repo.root), "--base", "main", "--head", "HEAD", "--cache-dir",
            str(repo.cache), "--jobs", "1", "--format", "json", "--skip-mutants",
            "--full"]  # fmt: skip
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(args)
    return code, json.loads(out.getvalue() or "{}"), err.getvalue()


def _next_pr_with_a_bug(repo: PrRepo) -> None:
    repo.git("checkout", "-q", "-f", "main")
    repo.git("checkout", "-q", "-b", "next")
    repo.replace(MIXER, *BUG)
    repo.pr("mixer", "a plain bug")


@pytest.mark.smoke
@pytest.mark.parametrize("confined", [True, False], ids=["confined", "not-confined"])
def test_a_pr_that_plants_a_file_in_the_environment_poisons_nothing(
    pr_repo: PrRepo, confined: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    env_dir = _fake_env(pr_repo.cache)
    if not confined:
        monkeypatch.setattr(confine, "confined", lambda box, paths: (box, "not confined: test"))
    pr_repo.replace(MIXER, '__all__ = ["mix"]\n', PLANT)
    pr_repo.pr("mixer", "tidy")
    code, out, err = _verdict(pr_repo)
    assert code == 1
    assert "source.name" in rules_of(out)
    site = next(env_dir.glob("lib/python*/site-packages"), None)
    if confined and "(confined (" in err:
        assert "sandbox.tampered" not in rules_of(out)
        assert site is not None and not (site / POISON).exists()  # the write failed
        assert env_trust.verify(env_dir) == []
    else:
        assert "sandbox.tampered" in rules_of(out)
        assert not env_dir.exists()  # discarded with its seal
        _fake_env(pr_repo.cache)  # built again for the next verdict (no index here)
    _next_pr_with_a_bug(pr_repo)
    code, out, _ = _verdict(pr_repo)
    assert code == 1
    assert "tests.failed" in rules_of(out)


WRAPPER = '#!/bin/sh\nexec {python} "$@" | sed s/BROKEN/KEPT/g\n'


def _poison(env_dir: Path, what: str) -> Path:
    """Change the sealed environment the way issue 19's attack did; the file changed."""
    if what == "pth":
        target = next(env_dir.glob("lib/python*/site-packages")) / POISON
        target.write_text("import sys; sys.exit(0)\n")
    elif what == "interpreter":  # a wrapper that rewrites what later runs report
        target = env_dir / "bin" / "python"
        real = os.path.realpath(target)
        target.unlink()
        target.write_text(WRAPPER.format(python=real))
        target.chmod(0o755)
    else:
        target = env_dir / "pyvenv.cfg"
        target.write_text(target.read_text() + "include-system-site-packages = true\n")
    return target


@pytest.mark.parametrize("what", ["pth", "interpreter", "pyvenv.cfg"])
def test_an_environment_changed_between_verdicts_is_not_used(
    pr_repo: PrRepo, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    env_dir = _fake_env(pr_repo.cache)
    env_trust.seal(env_dir)
    poisoned = _poison(env_dir, what)  # after the seal, outside any verdict
    before = poisoned.read_bytes()
    rebuilt: list[Path] = []

    def build(cache: Path, constraints: str, say: object) -> str:
        if not env_dir.exists():
            rebuilt.append(_fake_env(cache))
        return str(env_dir / "bin" / "python")

    monkeypatch.setattr(environment, "build", build)
    pr_repo.replace(MIXER, *BUG)
    pr_repo.pr("mixer", "a plain bug")
    code, out, err = _verdict(pr_repo)
    assert "changed since it was sealed" in err
    assert rebuilt and not (poisoned.exists() and poisoned.read_bytes() == before)
    assert code == 1
    assert "tests.failed" in rules_of(out)
