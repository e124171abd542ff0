"""What a test report was produced from: the tree it tested, stage by stage.

``tree(root)`` hashes, in a fixed order, the path and bytes of every file that
decides a stage test run: ``packages/*/src/**``, ``packages/*/tests/**``, the
acceptance tests ``specs/*/tests/**``, the spec kit they import (``specs/_kit``),
the root ``conftest.py`` and the root ``pyproject.toml`` (pytest's settings).
Caches (``__pycache__``, ``*.pyc``, dot-folders) are left out. The pytest
plugin writes it into every report; the gate recomputes it, and a report
from another tree is stale.

The hash it returns (a ``Fingerprint``, a ``str``) also carries one **key per
stage**: the stage's own files (``packages/<stage>/src``, ``tests``, its
``pyproject.toml`` and ``specs/<stage>/tests``), the shared root files, the
spec kit where its spec declares kit modules (``[oracle] kit``, read from
``specs/<stage>.toml``), and the own files of every
stage it reaches through its package's dependencies (the packages'
``pyproject.toml``) and through the modules its tests (or the kit they load)
import (kv_cache's tests run the fast path, which its package does not
declare).
An edit changes the key of its stage and of the stages that reach it, no
other: a comment in a leaf stage leaves rope's tests fresh.
``owner(nodeid)`` names the stage a test belongs to.

Imports nothing from the checker: the plugin and the gate both use it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import tomllib
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from niels_gpt_contracts.digests import Digest

__all__ = ["Fingerprint", "imported_names", "owner", "stage_keys", "tree"]

PATTERNS = ("packages/*/src", "packages/*/tests", "specs/*/tests", "specs/_kit")
ROOT_FILES = ("conftest.py", "pyproject.toml")
KIT = (
    "specs",
    "_kit",
)  # the spec kit (``checks.context.speckit``), part of the stages declaring it
KIT_KEY = "_kit"  # its files' bucket; no stage id starts with "_"
KIT_PACKAGE = "speckit"  # the package under specs/_kit that spec-side files import


class Fingerprint(str):
    """The tree hash; ``stages`` maps each stage (``packages/<stage>``) to its key."""

    stages: dict[str, str]

    def __new__(cls, digest: str, stages: dict[str, str]) -> Fingerprint:
        made = super().__new__(cls, digest)
        made.stages = stages
        return made


def _files(root: Path) -> Iterator[Path]:
    for pattern in PATTERNS:
        for folder in sorted(root.glob(pattern)):
            for path in sorted(folder.rglob("*")):
                rel = path.relative_to(root).parts
                if any(p.startswith(".") or p == "__pycache__" for p in rel):
                    continue
                if path.is_file() and path.suffix != ".pyc":
                    yield path
    for name in ROOT_FILES:
        if (root / name).is_file():
            yield root / name


def owner(nodeid: str) -> str | None:
    """The stage a test id or path belongs to: ``packages/<s>/tests/...`` or
    ``specs/<s>/tests/...``; ``None`` for anything else (README examples)."""
    parts = nodeid.split("::", 1)[0].replace("\\", "/").split("/")
    if len(parts) > 3 and parts[0] in ("packages", "specs") and parts[2] == "tests":
        return parts[1]
    return None


def _stage_of_file(rel: tuple[str, ...]) -> str | None:
    if len(rel) > 2 and rel[0] == "packages":
        return rel[1]
    if len(rel) > 3 and rel[0] == "specs" and rel[2] == "tests":
        return rel[1]
    return None


def _dependencies(root: Path) -> dict[str, list[str]]:
    """Stage -> the stages its package declares as dependencies (by distribution name)."""
    names: dict[str, str] = {}
    wanted: dict[str, list[str]] = {}
    for path in sorted(root.glob("packages/*/pyproject.toml")):
        try:
            project = tomllib.loads(path.read_text(encoding="utf-8")).get("project", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            project = {}  # an unreadable file still changes the stage's own key
        stage = path.parent.name
        names[canonicalize_name(str(project.get("name", "")))] = stage
        deps = project.get("dependencies", [])
        wanted[stage] = [str(d) for d in deps] if isinstance(deps, list) else []
    return {
        stage: sorted({names[n] for d in deps if (n := _requirement_name(d)) in names} - {stage})
        for stage, deps in wanted.items()
    }


def _requirement_name(text: str) -> str | None:
    """The canonical distribution name a requirement asks for; None if it is not one."""
    try:
        return canonicalize_name(Requirement(text).name)
    except InvalidRequirement:
        return None


def _kit_users(root: Path) -> dict[str, set[str]]:
    """The stages whose ``specs/<stage>.toml`` declares spec kit modules, with those
    modules; a spec that does not parse declares none (the gate refuses it)."""
    found: dict[str, set[str]] = {}
    for path in sorted(root.glob("specs/*.toml")):
        try:
            oracle = tomllib.loads(path.read_text(encoding="utf-8")).get("oracle", {})
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
            continue
        if isinstance(oracle, dict) and oracle.get("kit"):
            found[path.stem] = {str(m) for m in oracle["kit"]}
    return found


def _kit_reach(declared: set[str], kit_imports: dict[str, set[str]]) -> set[str]:
    """What the kit modules a stage declares import, through the kit's own imports of
    each other (``model_sweeps`` loads ``sweeps``) and its ``__init__``: a stage whose
    kit is torch-only does not reach the stages another kit module builds on."""
    seen, todo = set(), {*declared, "__init__"}
    while todo:
        module = todo.pop()
        if module in seen or module not in kit_imports:
            continue
        seen.add(module)
        for name in kit_imports[module]:
            package, _, leaf = name.partition(".")
            if package == KIT_PACKAGE:
                todo.add(leaf or "__init__")
    return {name for m in seen for name in kit_imports[m]}


def _module_of(rel: tuple[str, ...]) -> str | None:
    """``packages/<s>/src/a/b.py`` -> ``a.b``, ``.../a/b/__init__.py`` -> ``a.b`` (what an
    import names: ``from a.b import X`` loads the package); anything else -> ``None``."""
    if len(rel) > 3 and rel[0] == "packages" and rel[2] == "src" and rel[-1].endswith(".py"):
        parts = (*rel[3:-1], rel[-1].removesuffix(".py"))
        return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
    return None


def imported_names(source: str | bytes, strings: bool = False) -> set[str]:
    """Every dotted module name an import statement in ``source`` may load (``import
    a.b``; ``from a import b``: ``a`` and ``a.b``; relative imports left out), and with
    ``strings`` every string constant too (``import_module("x.y")``). Source that
    does not parse names nothing."""
    try:
        parsed = ast.parse(source)
    except (SyntaxError, ValueError):
        return set()  # a test file's bytes still count in its stage's own key
    found: set[str] = set()
    for node in ast.walk(parsed):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif strings and isinstance(node, ast.Constant) and isinstance(node.value, str):
            found.add(node.value)
    return found


def _closure(stage: str, edges: dict[str, set[str]]) -> set[str]:
    seen, todo = {stage}, [stage]
    while todo:
        for nxt in edges.get(todo.pop(), set()) - seen:
            seen.add(nxt)
            todo.append(nxt)
    return seen


def _hash(root: Path) -> tuple[str, dict[str, str]]:
    digest = Digest()
    own: dict[str, Digest] = {}
    shared = Digest()
    modules: dict[str, str] = {}  # module name -> the stage whose src holds it
    imports: dict[str, set[str]] = {}  # stage -> modules its tests import
    kit_imports: dict[str, set[str]] = {}  # kit module (file stem) -> what it imports
    for path in _files(root):
        rel = path.relative_to(root).parts
        data = path.read_bytes()
        name = path.relative_to(root).as_posix().encode("utf-8", "surrogateescape")
        stage = _stage_of_file(rel)
        bucket = KIT_KEY if rel[:2] == KIT else stage or ""
        for sink in (digest, own.setdefault(bucket, Digest())):
            sink.add(name, data)
        if len(rel) == 1 and rel[0] in ROOT_FILES:
            shared.add(name, data)
        if rel[:2] == KIT and path.suffix == ".py":
            kit_imports.setdefault(path.stem, set()).update(imported_names(data, strings=True))
        if (module := _module_of(rel)) is not None and stage is not None:
            modules[module] = stage
        if stage is not None and "tests" in rel[2:3] and path.suffix == ".py":
            imports.setdefault(stage, set()).update(imported_names(data, strings=True))
    for path in sorted(root.glob("packages/*/pyproject.toml")):  # not in the tree hash
        own.setdefault(path.parent.name, Digest()).raw(b"pyproject\0" + path.read_bytes())
    # A stage's tests depend on the stages its package declares and on those
    # whose modules they import (kv_cache's tests run the fast path).
    edges = {stage: set(deps) for stage, deps in _dependencies(root).items()}
    for stage, declared in _kit_users(root).items():  # the kit they declare, what it imports
        imports.setdefault(stage, set()).update(_kit_reach(declared, kit_imports))
        edges.setdefault(stage, set()).add(KIT_KEY)
    for stage, names in imports.items():
        edges.setdefault(stage, set()).update(modules[n] for n in names if n in modules)
    stages = {p.name for p in root.glob("packages/*") if p.is_dir()}
    stages |= {p.parent.name for p in root.glob("specs/*/tests") if p.is_dir()}
    keys = {}
    for stage in sorted(stages):
        h = Digest().raw(f"stage {stage}\0".encode() + shared.digest())
        for member in sorted(_closure(stage, edges)):
            h.raw(f"{member}\0".encode() + own.get(member, Digest()).digest())
        keys[stage] = h.hexdigest()
    return digest.hexdigest(), keys


def stage_keys(root: Path) -> dict[str, str]:
    """Each stage's key under ``root`` (see the module docstring)."""
    return _hash(root)[1]


def tree(root: Path) -> Fingerprint:
    """The hex SHA-256 of every file that decides a stage test run under ``root``,
    carrying each stage's key in ``.stages``."""
    digest, keys = _hash(root)
    return Fingerprint(digest, keys)
