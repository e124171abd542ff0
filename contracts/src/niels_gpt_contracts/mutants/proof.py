"""What decides a mutant's kill, as a key: a proof is reused only under the same key.

A kill is the pair of facts "the tests pass on the clean code" and "they fail
on the mutated code", in one environment. What can change either fact:

- **the code under test**: every stage module the runs can import (all of
  the tree's ``packages/*/src`` modules, not only the mutated function's: a
  killing test of ``block`` runs ``attention`` and ``rope`` too, and a change
  anywhere in the stages could hide the bug from it), and the mutated text of
  the patched module. Taken in *normal form*: the ``ast`` of each module
  without its docstrings and without positions, so comments, blank lines,
  layout and docstrings are not part of it. Python runs the same code for
  two texts with the same normal form, except for what reads source text,
  docstrings or line numbers at run time; so when any module or test names
  one of those readers (``__doc__``, ``inspect``, ``linecache``,
  ``lineno``, ``__file__``, ``getsource``... in code or in a string, not in
  prose), every text is taken exactly instead. A PEP 263 coding line, which
  changes how the bytes decode, is kept in the normal form. A module that
  does not parse is taken exactly.
- **the tests**: the test files that run (exact text: pytest reads them, and
  hypothesis keys its examples on their source), and any other file beside
  them that they could import;
- **how they run**: the root ``conftest.py`` and pytest settings, the
  checker's own files (plugin, fork server, bootstrap, pytest arguments);
- **the environment**: the interpreter and its import path, as a hash of
  the names, sizes and modification times of every file on it (a cache
  restored from a tarball keeps these; a rebuilt one does not, and proves
  its kills again).

So a PR that only edits docstrings or comments reuses every proof; a PR that
changes one statement anywhere in the stages proves every kill of its closure
again. A proof key never orders or skips a run by itself: a key miss runs the
mutant.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import niels_gpt_contracts
from niels_gpt_contracts.digests import Digest
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.sandbox.environment import Snapshot

KEY_VERSION = "proof-3"  # 3: exactness decided per key, over the tests it runs
# Names through which a program can see its own text, docstrings or positions.
READERS = frozenset(
    {
        "__doc__", "__file__", "__spec__", "__loader__", "__cached__", "__path__",
        "__code__", "__wrapped__", "inspect", "linecache", "tokenize", "pydoc", "traceback",
        "dis", "importlib", "pkgutil", "help", "getdoc", "getsource", "getsourcelines",
        "getsourcefile", "getcomments", "findsource", "get_data", "get_source",
        "_getframe", "currentframe", "f_lineno", "tb_lineno", "lineno", "co_firstlineno",
        "co_lines", "co_positions", "f_code", "f_back", "read_text", "read_bytes",
    }
)  # fmt: skip
_CODING = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*([-\w.]+)")
_DOC_OWNERS = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def _strip_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if not isinstance(node, _DOC_OWNERS) or not node.body:
            continue
        first = node.body[0]
        if (
            isinstance(first, ast.Expr)
            and isinstance(first.value, ast.Constant)
            and isinstance(first.value.value, str)
        ):
            node.body = node.body[1:] or [ast.Pass()]


def _names(tree: ast.AST) -> Iterable[str]:
    """Identifiers and string constants of code (docstrings already stripped)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            yield node.id
        elif isinstance(node, ast.Attribute):
            yield node.attr
        elif isinstance(node, ast.alias):
            yield from node.name.split(".")
            if node.asname:
                yield node.asname
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield from node.module.split(".")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value


def parse(text: str) -> ast.Module | None:
    """The module's tree without docstrings, or None when it does not parse."""
    try:
        tree = ast.parse(text)
    except (SyntaxError, ValueError):
        return None
    _strip_docstrings(tree)
    return tree


def reads_itself(texts: Iterable[str]) -> bool:
    """Whether any text could see source text, docstrings or positions at run time."""
    for text in texts:
        tree = parse(text)
        if tree is None or any(name in READERS for name in _names(tree)):
            return True
    return False


def normal_form(text: str) -> str:
    """The code as Python runs it: ``ast`` without docstrings, positions or comments."""
    tree = parse(text)
    if tree is None:
        return "text:" + text
    cookie = [m.group(1) for line in text.splitlines()[:2] if (m := _CODING.match(line))]
    return f"coding:{cookie}\n" + ast.dump(tree, include_attributes=False)


def _form(exact: bool, text: str) -> str:
    """``text`` as a key takes it: exactly, or in normal form."""
    return "exact:" + text if exact else normal_form(text)


def _sha(parts: Iterable[str]) -> str:
    return Digest(*parts).hexdigest()


def checker_files() -> list[str]:
    """The checker's own sources (plugin, fork server, bootstrap, arguments), as key parts."""
    root = Path(niels_gpt_contracts.__file__).resolve().parent
    return [
        f"{p.relative_to(root)}\n{p.read_text(encoding='utf-8')}"
        for p in sorted(root.rglob("*.py"))
    ]


def environment(site_paths: Sequence[str]) -> str:
    """The interpreter's import path: names, sizes and modification times of its files.

    Bytecode (``.pyc``) is left out: Python writes it as modules are first
    imported, and checks it against its source before using it.
    """
    files = Snapshot.take(site_paths).files
    rows = []
    for i, root in enumerate(site_paths):
        prefix = root.rstrip(os.sep) + os.sep
        rows += [
            f"{i}:{p[len(prefix) :]}:{size}:{mtime}"
            for p, (size, mtime, _ctime) in files.items()
            if p.startswith(prefix) and not p.endswith(".pyc")
        ]
    return _sha(sorted(rows))


class ProofKeys:
    """Keys of the mutants of one run: code, tests, configuration and environment fixed.

    Whether texts are taken exactly is decided per key, over the stage code and
    the test files that key's runs can import: a reader in a test that never
    runs for a mutant (a later stage's tests, in a PR's closure) cannot see
    that mutant's code, so it does not make that mutant's key exact.
    """

    def __init__(
        self,
        code: Mapping[str, str],
        tests: Mapping[str, str],
        config: Sequence[str],
        environment_id: str,
    ) -> None:
        self.code_reads = reads_itself(code.values())
        self.tests = dict(tests)
        head = [KEY_VERSION, environment_id, *config]
        self.fixed = {
            exact: _sha([*head, *(f"{p}\n{_form(exact, t)}" for p, t in sorted(code.items()))])
            for exact in (False, True)
        }
        self._reads: dict[str, bool] = {}

    def _reader(self, test: str) -> bool:
        if test not in self._reads:
            self._reads[test] = reads_itself([self.tests[test]])
        return self._reads[test]

    def key(self, name: str, file: str, mutated: str, tests: Sequence[str]) -> str:
        """The key of mutant ``name``: ``mutated`` is the patched text of ``file``;
        ``tests`` run, and so count, with every file in their folders."""
        missing = [t for t in tests if t not in self.tests]
        if missing:
            raise ConfigError(f"proof key of {name}: expected the text of {missing[0]}, found none")
        folders = {t.rsplit("/", 1)[0] for t in tests}
        ran = sorted({*tests, *(t for t in self.tests if t.rsplit("/", 1)[0] in folders)})
        exact = self.code_reads or any(self._reader(t) for t in ran)
        parts = [f"{t}\n{self.tests[t]}" for t in ran]
        return _sha([self.fixed[exact], name, file, _form(exact, mutated), *parts])
