"""A new stage's skeleton: the maintainers' spec side and the stage's package, gated.

``new_stage(root, name, after)`` writes what a maintainer's first commit for
a stage holds, as ``cargo new`` does for a crate:

- ``specs/<name>.toml``: the paths (its package may change, every existing
  stage's may not), the owned module, a dependency rule, one invariant, the
  ``[oracle]`` table, and the ``[[api]]`` frozen from the skeleton's code
  (``freeze``: the package exports nothing yet);
- ``specs/<name>/``: a float64 reference stub, an oracle driver whose sweep
  table is empty, an acceptance test claiming the invariant, ``CHANGELOG.md``;
- ``packages/<name>/``: ``pyproject.toml`` depending on ``after`` and what it
  depends on, ``README.md``, ``src/niels_gpt/model/<name>/`` with
  ``__init__.py`` (an empty ``__all__``) and ``py.typed``, and ``tests/``.

Nothing else is registered by hand: nox and CI find stage packages by
``packages/*/pyproject.toml`` (``noxkit.paths.PACKAGES``), the dev environment
installs each of them, and the checker reads every ``specs/*.toml``. The
skeleton passes ``contracts check --stage <name>``. Errors (a name that is
not a lower-case identifier or is taken, an unknown ``after``) are
``ConfigError`` naming the expected and the actual value, before anything is
written.
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import tomllib

from niels_gpt_contracts.authoring import freeze
from niels_gpt_contracts.checks.context.loading import load_specs
from niels_gpt_contracts.checks.spec_changes.changelog import changelog_path
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.gitdiff import GitRepo, WorkingTree
from niels_gpt_contracts.stagespec import Spec

_NAME = re.compile(r"^[a-z][a-z0-9_]*$")

SPEC = """\
#:schema ./spec.schema.json
# Stage spec read by the `contracts` gate (see contracts/README.md).
# Scaffolded by `contracts new-stage {name} --after {after}`: say what the stage
# adds and why in the title, the invariants and the API; history goes to
# specs/{name}/CHANGELOG.md.

schema_version = 3
version = "1.0.0"
id = "{name}"
title = "The {name} stage (scaffolded; say what it adds)"
package = "packages/{name}"
distribution = "{distribution}"
depends_on = [{depends}]
# The module files this stage owns under packages/{name}/src/, exactly.
modules = ["niels_gpt/model/{name}/__init__.py"]

[paths]
may_change = ["packages/{name}/**"]
must_not_change = [
{frozen_paths}
    "packages/*/src/niels_gpt/__init__.py",
    "packages/*/src/niels_gpt/model/__init__.py",
]

{api}
[[rules]]
id = "dependencies"
kind = "dependencies"
message = "{name} depends on torch, numpy and the stages it builds on only"
pyproject = "packages/{name}/pyproject.toml"
allowed = [{allowed}]

[oracle]
driver = "specs/{name}/{name}_oracle.py:calls"
references = {{ "niels_gpt.model.{name}" = "specs/{name}/{name}_reference.py" }}

[[invariants]]
id = "exports"
text = "niels_gpt.model.{name} imports on its own and exports exactly its spec's API names."
"""

REFERENCE = '''\
"""A float64 reference of the {name} stage, written from specs/{name}.toml (stub).

The oracle answers a stage's first PR with this module in place of
``niels_gpt.model.{name}``: define each name the spec's API pins, computed
in float64 from the spec's definitions, and list it in ``__all__``.
"""

from __future__ import annotations

__all__: list[str] = []
'''

ORACLE = '''\
"""The {name} stage's oracle driver (maintainer-owned; run by ``contracts pr``).

``calls(o)`` drives the stage's public API with inputs drawn from the
verdict's secret seed; each answer is compared with the base's, or, for the
stage's first PR, with the float64 reference beside this file. ``SWEEP`` is
the table of calls: one row per call, a name (``<group>/<case>``) and what
builds the callable from the oracle handle. It is empty until the spec pins
an API.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from niels_gpt_contracts.driverkit import Oracle

SWEEP: tuple[tuple[str, Callable[[Oracle], Callable[[], Any]]], ...] = ()


def calls(o: Oracle) -> None:
    """Every row of ``SWEEP``, in order."""
    for name, build in SWEEP:
        o.call(name, build(o), desc=name, stages=1, reduction=1)
'''

ACCEPTANCE = '''\
"""Acceptance tests of the {name} stage, written from specs/{name}.toml.

They run where the verdict puts them (beside the base's drivers, without the
spec), so what they check is written here: ``EXPORTS`` is the spec's API.
"""

from __future__ import annotations

import importlib

import pytest

EXPORTS: list[str] = []  # the exports of niels_gpt.model.{name} in specs/{name}.toml


@pytest.mark.invariant("{name}.exports")
def test_exports_are_the_spec_api() -> None:
    module = importlib.import_module("niels_gpt.model.{name}")
    found = sorted(module.__all__)
    assert found == EXPORTS, f"expected __all__ = {{EXPORTS}}, found {{found}}"
'''

CHANGELOG = """\
# Changelog of the {name} spec

Newest first. Each version of `specs/{name}.toml` (the contract's version, judged by the
amendment check) with what changed and why.

## 1.0.0

- The stage's spec scaffolded after `{after}`: paths, the owned package, the dependency
  rule, the oracle's driver and float64 reference stubs, and the API frozen from the
  skeleton (nothing exported yet).
"""

PYPROJECT = """\
[build-system]
requires = ["hatchling>=1.25"]
build-backend = "hatchling.build"

[project]
name = "{distribution}"
version = "0.1.0"
description = "niels_gpt stage {name}"
readme = "README.md"
requires-python = ">=3.10"
license = "MIT"
dependencies = [{requirements}]

[tool.hatch.build.targets.wheel]
# PEP 420 namespace: niels_gpt and niels_gpt.model have no __init__.py.
packages = ["src/niels_gpt"]
"""

README = """\
# {distribution}

The {name} stage of niels_gpt: `niels_gpt.model.{name}` (scaffolded after `{after}`;
its contract is specs/{name}.toml).
"""

INIT = '''\
"""The {name} stage (scaffolded): its public names, re-exported here."""

__all__: list[str] = []
'''

STAGE_TEST = '''\
"""The {name} stage's own tests."""

import niels_gpt.model.{name} as stage


def test_imports() -> None:
    assert stage.__all__ == []
'''


def _quoted(names: list[str]) -> str:
    return ", ".join(f'"{n}"' for n in names)


def _closure(specs: dict[str, Spec], after: str) -> list[str]:
    """``after`` and every stage it depends on, in the specs' dependency order."""
    found, todo = set(), [after]
    while todo:
        stage = todo.pop()
        if stage not in found:
            found.add(stage)
            todo += list(specs[stage].depends_on)
    return [s for s in specs if s in found]


def _pins(root: Path, specs: dict[str, Spec], stages: list[str]) -> list[str]:
    """``<distribution>~=<version>`` of each stage, its version read from its pyproject."""
    pins = []
    for stage in stages:
        pyproject = root / specs[stage].package / "pyproject.toml"
        try:
            version = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"]
        except (OSError, tomllib.TOMLDecodeError, KeyError) as err:
            raise ConfigError(f"expected a [project] version in {pyproject}, found none") from err
        pins.append(f"{specs[stage].distribution}~={version}")
    return pins


def _check(root: Path, specs: dict[str, Spec], name: str, after: str) -> None:
    if not _NAME.fullmatch(name):
        raise ConfigError(f"expected a lower-case identifier ([a-z][a-z0-9_]*), found {name!r}")
    if name in specs or (root / "packages" / name).exists() or (root / "specs" / name).exists():
        raise ConfigError(f"expected a new stage name, found {name!r} taken (a spec or a folder)")
    if after not in specs:
        raise ConfigError(f"expected --after among {sorted(specs)}, found {after!r}")


def new_stage(root: Path, name: str, after: str) -> list[str]:
    """Write the skeleton of stage ``name`` under ``root``; the repository paths written."""
    repo = GitRepo.discover(root)
    specs = load_specs(WorkingTree(repo))
    _check(root, specs, name, after)
    depends = _closure(specs, after)
    distribution = f"niels-gpt-{name.replace('_', '-')}"
    dists = [specs[s].distribution for s in depends]
    fill = {
        "name": name,
        "after": after,
        "distribution": distribution,
        "depends": _quoted(depends),
        "allowed": _quoted(["torch", "numpy", *dists]),
        "requirements": _quoted(["torch>=2.13", "numpy>=1.24", *_pins(repo.root, specs, depends)]),
        "frozen_paths": "\n".join(f'    "{specs[s].package}/**",' for s in specs),
    }
    files = {
        f"packages/{name}/pyproject.toml": PYPROJECT,
        f"packages/{name}/README.md": README,
        f"packages/{name}/src/niels_gpt/model/{name}/__init__.py": INIT,
        f"packages/{name}/src/niels_gpt/model/{name}/py.typed": "",
        f"packages/{name}/tests/test_{name}.py": STAGE_TEST,
        f"specs/{name}/{name}_reference.py": REFERENCE,
        f"specs/{name}/{name}_oracle.py": ORACLE,
        f"specs/{name}/tests/test_{name}_acceptance.py": ACCEPTANCE,
        changelog_path(name): CHANGELOG,
    }
    for path, template in files.items():
        _write(repo.root / path, template.format(**fill))
    spec_path = f"specs/{name}.toml"
    _write(
        repo.root / spec_path, SPEC.format(**fill, api=_frozen_api(repo.root, name, specs, after))
    )
    return [*files, spec_path]


def _frozen_api(root: Path, name: str, specs: dict[str, Spec], after: str) -> str:
    """The ``[[api]]`` of the skeleton, frozen from the package just written: the
    draft is ``after``'s spec with the new stage's id and module and no API yet."""
    draft = replace(specs[after], id=name, modules=(f"niels_gpt/model/{name}/__init__.py",), api=())
    source = freeze.load(root, {**specs, name: draft}, freeze.module_names(draft))
    return freeze.to_toml(freeze.freeze(source, draft, everything=True))


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
