"""The ``max_nesting`` kind of spec rule: no function of the matched files nests
its blocks deeper than ``depth``."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from niels_gpt_contracts.rules import rule_kinds
from niels_gpt_contracts.stagespec import load_schema, parse_spec

ROOT = Path(__file__).resolve().parents[2]
RULE = '\n[[rules]]\nid = "flat"\nkind = "max_nesting"\nmessage = "m"\nfiles = ["src/**"]\n'
CODE = """\
def shallow(x):
    if x:
        for i in x:
            pass


def deep(x):
    for i in x:
        if i:
            with open(i) as f:
                while f:
                    pass
    def inner():
        if x:
            pass
"""


class Files:
    """A tree of texts, as a static check reads it."""

    def __init__(self, texts: dict[str, str]) -> None:
        self.texts = texts

    def files(self) -> list[str]:
        return sorted(self.texts)

    def read(self, path: str) -> str | None:
        return self.texts.get(path)

    def read_many(self, paths: Iterable[str]) -> dict[str, str | None]:
        return {p: self.texts.get(p) for p in paths}


def test_a_spec_may_declare_a_max_nesting_rule() -> None:
    schema = load_schema((ROOT / "specs" / "spec.schema.json").read_text())
    text = (ROOT / "specs" / "core.toml").read_text() + RULE + "depth = 3\n"
    (rule,) = [r for r in parse_spec("specs/core.toml", text, schema).rules if r.id == "flat"]
    assert rule.rule_id == "static.flat" and rule.params["depth"] == 3


def test_a_function_nested_deeper_than_the_depth_is_found_at_its_deepest_block() -> None:
    check = rule_kinds()["max_nesting"].check
    assert check is not None
    tree = Files({"src/m.py": CODE, "other/m.py": CODE, "src/bad.py": "def f(:\n"})
    found = check({"files": ["src/**"], "depth": 3}, tree, tree.files())
    assert found == [
        ("src/bad.py", None, "cannot parse (line 1: invalid syntax)"),
        ("src/m.py", 11, "function 'deep' nests 4 blocks deep (at most 3)"),
    ]
    assert check({"files": ["src/m.py"], "depth": 4}, tree, tree.files()) == []
