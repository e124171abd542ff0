"""A PR's closure follows what imports a stage, not only ``depends_on`` (issue 28).

kv_cache's and padding's tests and oracle drivers run the fast path, though
neither package depends on it: a fastpath PR must be judged by them too.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from niels_gpt_contracts.checks.context import importers
from niels_gpt_contracts.checks.context.loading import load_specs
from niels_gpt_contracts.gitdiff import GitRepo, Tree, WorkingTree
from niels_gpt_contracts.stagespec import Spec
from niels_gpt_contracts.verdict import plan

ROOT = Path(__file__).resolve().parents[2]


class Texts(Tree):
    """A tree of the given texts (path -> text), nothing on disk."""

    def __init__(self, texts: dict[str, str]) -> None:
        self.texts = texts

    def files(self) -> list[str]:
        return sorted(self.texts)

    def read(self, path: str) -> str | None:
        return self.texts.get(path)

    def read_many(self, paths: Iterable[str]) -> dict[str, str | None]:
        return {p: self.texts.get(p) for p in paths}


def _ids(found: list[Spec]) -> list[str]:
    return [s.id for s in found]


def test_a_fastpath_change_brings_the_stages_that_run_the_fast_path() -> None:
    tree = WorkingTree(GitRepo(ROOT))
    specs = load_specs(tree)
    uses = importers.uses(specs, tree)
    assert "fastpath" in uses["kv_cache"] and "fastpath" in uses["padding"]
    assert _ids(plan.closure({"fastpath"}, specs)) == ["fastpath"]  # depends_on alone
    assert _ids(plan.closure({"fastpath"}, specs, uses)) == [
        "fastpath",
        "gqa",  # its driver and acceptance tests run grouped heads through the fast path
        "kv_cache",
        "padding",
        "quant",  # its composition tests and driver run the fast path
    ]
    assert _ids(plan.closure({"padding"}, specs, uses)) == ["gqa", "padding", "quant"]
    assert _ids(plan.closure({"quant"}, specs, uses)) == ["quant"]


def test_imports_anywhere_in_a_stage_count_and_strings_do_not() -> None:
    real = load_specs(WorkingTree(GitRepo(ROOT)))
    specs = {k: real[k] for k in ("core", "rope", "attention", "fastpath", "kv_cache")}
    lazy = "def f():\n    from niels_gpt.model.fastpath import sdpa_kernel\n"
    texts = {
        "specs/kv_cache/kv_cache_oracle.py": lazy,  # a driver, lazily
        "specs/rope/rope_oracle.py": 'NAME = "niels_gpt.model.fastpath"\n',  # a string only
        "packages/attention/tests/test_x.py": "import niels_gpt.model.kv_cache as k\n",
        "specs/fastpath/broken.py": "def (:\n",  # does not parse: no edge, no error
    }
    uses = importers.uses(specs, Texts(texts))
    assert uses["kv_cache"] == {"fastpath"}
    assert uses["rope"] == set()
    assert uses["attention"] == {"kv_cache"}
    assert uses["fastpath"] == set()
