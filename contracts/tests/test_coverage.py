"""``oracle.coverage``: a spec's declared domain axes, each swept by its oracle driver.

The real drivers of the stages that declare axes are read as they are (every
axis found), then with one axis taken out of their source (named as unswept).
``contracts check`` (tree mode) and a ``Spec:`` amendment refuse a spec whose
driver leaves an axis out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from gatekit import Repo, rules

from niels_gpt_contracts.checks.context.loading import load_specs
from niels_gpt_contracts.checks.evidence.coverage import check_coverage, swept_axes
from niels_gpt_contracts.gitdiff import GitRepo, Tree, WorkingTree
from niels_gpt_contracts.sandbox.oracle_run import Call, Stream
from niels_gpt_contracts.stagespec import Spec
from niels_gpt_contracts.verdict.oracle import _unswept

ROOT = Path(__file__).resolve().parents[2]
DECLARING = ("rope", "attention", "block", "backbone_v1", "kv_cache", "padding", "fastpath")
STACKING = ("kv_cache", "padding", "fastpath")  # stages that also declare "combos"


class _Dict(Tree):
    """A tree held in a dict (path -> text)."""

    label = "dict"

    def __init__(self, files: Mapping[str, str]) -> None:
        self._files = dict(files)

    def files(self) -> list[str]:
        return sorted(self._files)

    def read(self, path: str) -> str | None:
        return self._files.get(path)


def _real() -> tuple[dict[str, Spec], dict[str, str]]:
    tree = WorkingTree(GitRepo.discover(ROOT))
    specs = load_specs(tree)
    texts = {f: t for f, t in tree.read_many(tree.files()).items() if f.startswith("specs/") and t}
    return dict(specs), texts


@pytest.mark.parametrize("stage", DECLARING)
def test_the_real_drivers_sweep_every_declared_axis(stage: str) -> None:
    specs, texts = _real()
    spec = specs[stage]
    assert spec.oracle is not None and {"magnitude", "grad2", "history"} <= set(spec.oracle.axes)
    assert check_coverage(spec, _Dict(texts)) == []


@pytest.mark.parametrize("stage", DECLARING)
@pytest.mark.parametrize("axis", ["magnitude", "grad2", "history", "errors"])
def test_an_axis_taken_out_of_the_driver_is_named(stage: str, axis: str) -> None:
    specs, texts = _real()
    spec = specs[stage]
    loaded = (f"specs/{stage}/", "specs/_kit/")  # its drivers and the oracle sweeps they load
    cut = {
        f: t.replace(f'"{axis}"', '"elsewhere"') if f.startswith(loaded) else t
        for f, t in texts.items()
    }
    found = check_coverage(spec, _Dict(cut))
    assert [(v.rule, v.stage) for v in found] == [("oracle.coverage", stage)]
    assert f"'{axis}'" in found[0].message


def _declaring(spec: Spec, kit: tuple[str, ...]) -> Spec:
    """``spec`` with its ``[oracle] kit`` declaration replaced by ``kit``."""
    assert spec.oracle is not None
    return replace(spec, oracle=replace(spec.oracle, kit=kit))


def test_the_kits_sweeps_count_only_for_a_stage_whose_spec_declares_them() -> None:
    specs, texts = _real()
    assert specs["attention"].oracle is not None
    assert "module_sweeps" in specs["attention"].oracle.kit  # its sweeps come from the kit
    found = check_coverage(_declaring(specs["attention"], ()), _Dict(texts))
    assert {v.rule for v in found} == {"oracle.coverage"}
    assert "'magnitude'" in " ".join(v.message for v in found)  # swept by the kit alone


@pytest.mark.parametrize("relay_imports_the_sweep", [True, False])
def test_a_kit_module_counts_through_the_kit_module_that_imports_it(
    relay_imports_the_sweep: bool,
) -> None:
    """attention declares one relay module of the kit; the sweep counts when it imports it."""
    specs, texts = _real()
    relay = "from speckit import module_sweeps\n" if relay_imports_the_sweep else "import torch\n"
    tree = {**texts, "specs/_kit/speckit/relay.py": relay}
    found = check_coverage(_declaring(specs["attention"], ("relay",)), _Dict(tree))
    if relay_imports_the_sweep:
        assert found == []
    else:
        assert "'magnitude'" in " ".join(v.message for v in found)


@pytest.mark.parametrize("stage", STACKING)
def test_combos_taken_out_of_the_driver_is_named(stage: str) -> None:
    specs, texts = _real()
    spec = specs[stage]
    assert spec.oracle is not None and "combos" in spec.oracle.axes
    own = f"specs/{stage}/"
    cut = {
        f: t.replace('"combos"', '"elsewhere"') if f.startswith(own) else t
        for f, t in texts.items()
    }
    found = check_coverage(spec, _Dict(cut))
    assert [(v.rule, v.stage) for v in found] == [("oracle.coverage", stage)]
    assert "'combos'" in found[0].message


def test_only_literals_in_axes_of_a_call_count() -> None:
    src = """
GRAD = ("grad2",)
TWICE = ("x",)
TWICE = ("history",)
def calls(o):
    o.call("a", f, axes=("magnitude", "dtype"))
    o.call("b", f, axes="layout")
    o.call("c", f, axes=GRAD)
    o.call("d", f, axes=TWICE)                 # bound twice: not a literal
    o.call("e", f, axes=tuple(["modes"]))      # built at run time: not seen
    o.other("f", f, axes=("errors",))          # not a call
    call("g", axes=("config",))                # not a method call
    return "history"
"""
    assert swept_axes(src) == {"magnitude", "dtype", "layout", "grad2"}


DRIVER = """
def calls(o):
    o.call("big", f, axes=("magnitude",))
    o.call("twice", f, axes=("grad2",))
"""
ORACLE = '\n[oracle]\ndriver = "specs/alpha/alpha_oracle.py:calls"\naxes = ["magnitude", "grad2"]\n'


def _declare(repo: Repo, driver: str = DRIVER) -> None:
    text = repo.read("specs/alpha.toml")
    head, sep, tail = text.partition("\n[[invariants]]")
    repo.write("specs/alpha.toml", head + ORACLE + sep + tail)
    repo.write("specs/alpha/alpha_oracle.py", driver)


def test_contracts_check_refuses_a_driver_that_leaves_an_axis_unswept(repo: Repo) -> None:
    _declare(repo)
    code, out = repo.gate_json("--no-api", "--stage", "alpha")
    assert code == 0, out
    repo.replace("specs/alpha/alpha_oracle.py", ', axes=("grad2",)', "")
    code, out = repo.gate_json("--no-api", "--stage", "alpha")
    assert code == 1
    assert rules(out) == {("oracle.coverage", "specs/alpha.toml")}
    assert any("'grad2'" in v["message"] for v in out["violations"])


@pytest.mark.parametrize("swept", [True, False])
def test_a_spec_amendment_whose_driver_leaves_an_axis_unswept_is_refused(
    repo: Repo, swept: bool
) -> None:
    driver = DRIVER if swept else DRIVER.replace(', axes=("grad2",)', "")
    repo.write("specs/alpha/alpha_oracle.py", driver)
    repo.commit("driver")
    _declare(repo, driver)
    repo.replace("specs/alpha.toml", 'version = "1.0.0"', 'version = "1.1.0"')
    repo.commit("alpha: declare the axes\n\nSpec: alpha")
    code, out = repo.gate_json("--base", "HEAD~1")
    assert (code, ("oracle.coverage", "specs/alpha.toml") in rules(out)) == (
        (0, False) if swept else (1, True)
    ), out


SIZED = DRIVER + '    o.call("gpt2", f, axes=("size",))\n'


@pytest.mark.parametrize("swept", [True, False])
def test_the_size_axis_is_declared_and_swept_like_any_other(repo: Repo, swept: bool) -> None:
    """``size`` (real-size draws of each shape-polymorphic call) is an axis the schema
    takes; a driver that names it in no call is refused for it."""
    _declare(repo, SIZED if swept else DRIVER)
    repo.replace("specs/alpha.toml", '"grad2"]', '"grad2", "size"]')
    code, out = repo.gate_json("--no-api", "--stage", "alpha")
    assert (code, rules(out)) == (
        (0, set()) if swept else (1, {("oracle.coverage", "specs/alpha.toml")})
    ), out
    assert swept or any("'size'" in v["message"] for v in out["violations"])


def test_an_axis_the_schema_does_not_know_is_refused(repo: Repo) -> None:
    _declare(repo, SIZED)
    repo.replace("specs/alpha.toml", '"grad2"]', '"grad2", "sizes"]')
    code, out = repo.gate_json("--no-api", "--stage", "alpha")
    assert code == 2, out


def _answer(stage: str, name: str, axes: tuple[str, ...]) -> Call:
    return Call(stage, name, "", 1, 1, (), (), None, None, None, "", {}, (), {}, axes)


def test_the_verdict_sees_which_axes_the_trusted_calls_carried() -> None:
    """At verdict time the base's (and reference's) calls must carry every declared axis."""
    spec = _real()[0]["rope"]
    assert spec.oracle is not None
    base, ref = Stream("base"), Stream("reference")
    for i, axis in enumerate(spec.oracle.axes):
        (ref if axis == "errors" else base).calls[("rope", f"c{i}")] = _answer(
            "rope", f"c{i}", (axis,)
        )
    assert _unswept([spec], [base, ref]) is None
    del ref.calls[("rope", f"c{spec.oracle.axes.index('errors')}")]
    base.calls[("attention", "x")] = _answer("attention", "x", ("errors",))  # another stage's
    assert _unswept([spec], [base, ref]) == "rope: errors"


def test_an_axis_whose_every_call_raised_is_unswept_but_errors_is_swept() -> None:
    """A raising call judges only the error contract: block 1.x's magnitude calls all
    raised TypeError (a keyword Block does not take) and swept nothing."""
    spec = _real()[0]["rope"]
    assert spec.oracle is not None
    base = Stream("base")
    for i, axis in enumerate(spec.oracle.axes):
        base.calls[("rope", f"c{i}")] = replace(
            _answer("rope", f"c{i}", (axis,)), error="TypeError"
        )
    assert _unswept([spec], [base]) == f"rope: {spec.oracle.axes[0]}"
    for key, call in base.calls.items():
        if call.axes != ("errors",):
            base.calls[key] = replace(call, error=None)
    assert _unswept([spec], [base]) is None
