"""Helpers: a small but real monorepo in a temporary git repository.

The layout mirrors niels_gpt (stage packages under ``packages/``, specs under
``specs/`` validated by the real schema) with two torch-free stages:

- ``alpha`` owns ``packages/alpha`` (module ``ngx.alpha_mod``);
- ``beta`` owns ``packages/beta`` (module ``ngx.beta_mod``), calls alpha
  through the module object, and may touch tests elsewhere only to add ``V=``
  to ``ModelConfig(...)`` calls.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from niels_gpt_contracts.cli import main

SCHEMA = Path(__file__).resolve().parents[2] / "specs" / "spec.schema.json"
REPORT_SCHEMA = SCHEMA.with_name("report.schema.json")

ALPHA_SPEC = """\
#:schema ./spec.schema.json
schema_version = 3
version = "1.0.0"
id = "alpha"
title = "Alpha stage"
package = "packages/alpha"
distribution = "ngx-alpha"
depends_on = []
modules = ["ngx/alpha_mod.py"]

[paths]
may_change = ["packages/alpha/**"]
must_not_change = ["packages/beta/**"]

[[api]]
object = "ngx.alpha_mod"
kind = "module"
exports = ["Thing", "rotate"]

[[api]]
object = "ngx.alpha_mod:rotate"
kind = "function"
signature = "(x: list[float], *, turns: int = 1, label: str | None = None) -> list[float]"

[[api]]
object = "ngx.alpha_mod:Thing"
kind = "class"
[api.methods]
__init__ = "(self, size: int)"
run = "(self, x: float, *, fast: bool = False) -> float"

[[rules]]
id = "no-cast-in-rotate"
kind = "forbidden_in_function"
message = "rotate never converts its input"
files = ["packages/alpha/src/**/*.py"]
function = "rotate"
methods = ["to", "float", "*cast*"]
follow_local_calls = true

[[rules]]
id = "dependencies"
kind = "dependencies"
message = "alpha depends on nothing"
pyproject = "packages/alpha/pyproject.toml"
allowed = []

[[invariants]]
id = "keeps_length"
text = "rotate returns a list as long as its input."

[[invariants]]
id = "turns_compose"
text = "Rotating twice by one turn equals rotating once by two."
"""

BETA_SPEC = """\
#:schema ./spec.schema.json
schema_version = 3
version = "1.0.0"
id = "beta"
title = "Beta stage"
package = "packages/beta"
distribution = "ngx-beta"
depends_on = ["alpha"]
modules = ["ngx/beta_mod.py"]

[paths]
may_change = ["packages/beta/**"]
must_not_change = ["packages/alpha/src/**"]

[[paths.line_scoped]]
id = "model-config-v"
paths = ["**/tests/**/*.py", "scripts/**/*.py"]
kind = "add_keyword"
callable = "ModelConfig"
keyword = "V"
description = "other tests may change only to add V= to ModelConfig(...) calls"

[[api]]
object = "ngx.beta_mod"
kind = "module"
exports = ["use"]

[[api]]
object = "ngx.beta_mod:use"
kind = "function"
signature = "(x: list[float]) -> list[float]"

[[rules]]
id = "alpha-as-module"
kind = "import_as_module"
message = "beta calls alpha through the module object"
files = ["packages/beta/src/**/*.py"]
module = "ngx.alpha_mod"
attributes = ["rotate"]
require_call = ["rotate"]

[[rules]]
id = "no-sdpa"
kind = "forbidden_name"
message = "no fused attention"
files = ["packages/beta/src/**/*.py"]
names = ["scaled_dot_product_attention"]

[[rules]]
id = "dependencies"
kind = "dependencies"
message = "beta depends on alpha only"
pyproject = "packages/beta/pyproject.toml"
allowed = ["ngx-alpha"]

[[invariants]]
id = "uses_alpha"
text = "use rotates its input once."
"""

ALPHA_MOD = """\
from __future__ import annotations

__all__ = ["Thing", "rotate"]


def _check(x: list[float]) -> None:
    if not x:
        raise ValueError("empty")


def rotate(x: list[float], *, turns: int = 1, label: str | None = None) -> list[float]:
    _check(x)
    n = turns % len(x)
    return x[n:] + x[:n]


class Thing:
    def __init__(self, size: int) -> None:
        self.size = size

    def run(self, x: float, *, fast: bool = False) -> float:
        return x * self.size
"""

BETA_MOD = """\
from __future__ import annotations

import ngx.alpha_mod as alpha_mod

__all__ = ["use"]


def use(x: list[float]) -> list[float]:
    return alpha_mod.rotate(x)
"""

ALPHA_TEST = """\
import pytest

from ngx.alpha_mod import rotate
from ngx.config import ModelConfig


@pytest.mark.invariant("alpha.keeps_length")
def test_keeps_length():
    cfg = ModelConfig(T=8)
    assert len(rotate([1.0, 2.0])) == 2


@pytest.mark.invariant("alpha.turns_compose")
def test_turns_compose():
    cfg = ModelConfig(
        T=8,
        C=32,
    )
    assert rotate(rotate([1.0, 2.0, 3.0])) == rotate([1.0, 2.0, 3.0], turns=2)
"""

BETA_TEST = """\
import pytest

from ngx.beta_mod import use


@pytest.mark.invariant("beta.uses_alpha")
def test_use():
    assert use([1.0, 2.0]) == [2.0, 1.0]
"""


def pyproject(name: str, deps: list[str]) -> str:
    quoted = ", ".join(f'"{d}"' for d in deps)
    return f'[project]\nname = "{name}"\nversion = "0.1.0"\ndependencies = [{quoted}]\n'


@functools.cache
def _report_validator() -> Draft202012Validator:
    schema = json.loads(REPORT_SCHEMA.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def valid_report(text: str) -> dict[str, Any]:
    """A ``--format json`` report, parsed, after it passes ``specs/report.schema.json``.

    Every JSON report a test reads goes through here, so each one is held to
    the published schema.
    """
    payload: dict[str, Any] = json.loads(text)
    errors = sorted(_report_validator().iter_errors(payload), key=lambda e: list(e.path))
    assert not errors, "report does not match specs/report.schema.json: " + "; ".join(
        f"{'/'.join(map(str, e.path)) or '(root)'}: {e.message}" for e in errors
    )
    return payload


class Repo:
    """A temporary git repository and the gate run against it."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def git(self, *args: str) -> str:
        out = subprocess.run(
            ["git", *args], cwd=self.root, capture_output=True, text=True, check=True
        )
        return out.stdout.strip()

    def write(self, path: str, text: str) -> None:
        target = self.root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")

    def read(self, path: str) -> str:
        return (self.root / path).read_text(encoding="utf-8")

    def replace(self, path: str, old: str, new: str) -> None:
        text = self.read(path)
        assert old in text, f"{old!r} not in {path}"
        self.write(path, text.replace(old, new, 1))

    def delete(self, path: str) -> None:
        (self.root / path).unlink()

    def symlink(self, path: str, target: str) -> None:
        (self.root / path).unlink(missing_ok=True)
        os.symlink(target, self.root / path)

    def commit(self, message: str = "change") -> str:
        self.git("add", "-A")
        self.git("commit", "-q", "--allow-empty", "-m", message)
        return self.git("rev-parse", "HEAD")

    def branch(self, name: str) -> None:
        self.git("checkout", "-q", "-b", name)

    def gate(self, *args: str) -> tuple[int, str, str]:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(["check", "--repo", str(self.root), *args])
            except SystemExit as exc:  # argparse usage errors
                code = int(exc.code or 0)
        return code, out.getvalue(), err.getvalue()

    def gate_json(self, *args: str) -> tuple[int, dict[str, Any]]:
        code, out, err = self.gate(*args, "--format", "json")
        return code, valid_report(out) if out else {"stderr": err}


def make_repo(root: Path) -> Repo:
    repo = Repo(root)
    root.mkdir(parents=True, exist_ok=True)
    repo.git("init", "-q", "-b", "main")
    repo.git("config", "user.name", "Test")
    repo.git("config", "user.email", "test@example.com")
    repo.git("config", "commit.gpgsign", "false")
    (root / "specs").mkdir()
    shutil.copy(SCHEMA, root / "specs" / "spec.schema.json")
    repo.write("specs/alpha.toml", ALPHA_SPEC)
    repo.write("specs/beta.toml", BETA_SPEC)
    repo.write("noxfile.py", "# sessions\n")
    repo.write("README.md", "# ngx\n")
    repo.write("packages/alpha/pyproject.toml", pyproject("ngx-alpha", []))
    repo.write("packages/alpha/src/ngx/alpha_mod.py", ALPHA_MOD)
    repo.write("packages/alpha/tests/test_alpha.py", ALPHA_TEST)
    repo.write("packages/beta/pyproject.toml", pyproject("ngx-beta", ["ngx-alpha>=0.1"]))
    repo.write("packages/beta/src/ngx/beta_mod.py", BETA_MOD)
    repo.write("packages/beta/tests/test_beta.py", BETA_TEST)
    repo.write("scripts/train.py", "from ngx.config import ModelConfig\n\ncfg = ModelConfig()\n")
    repo.commit("initial layout")
    return repo


def rules(payload: dict[str, Any]) -> set[tuple[str, str | None]]:
    """``(rule, path)`` of every violation in a JSON report."""
    return {(v["rule"], v["path"]) for v in payload["violations"]}
