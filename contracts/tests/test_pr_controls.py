"""``contracts pr`` accepts honest PRs: the controls of the gate-integrity scenarios."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from prkit import PrRepo

MIXER = "packages/mixer/src/ngt/model/mixer.py"
MIXER_TEST = "packages/mixer/tests/test_mixer.py"
ATTN = "packages/attention/src/ngt/model/attention.py"


def _statuses(out: dict[str, object]) -> dict[str, str]:
    return {o["check"]: o["status"] for o in out["outcomes"]}  # type: ignore[attr-defined,index]


def test_a_docstring_edit_is_kept(pr_repo: PrRepo) -> None:
    pr_repo.replace(MIXER, "def mix(", '"""Mixing."""\n\n\ndef mix(')
    pr_repo.pr("mixer")
    code, out, err = pr_repo.verdict()
    assert code == 0, (out.get("violations"), err[-2000:])
    statuses = _statuses(out)
    for check in ("tests:cpu", "device:cpu", "sandbox", "api", "mutants"):
        assert statuses[check] == "KEPT", check
    # The optional accelerator test skips on the base too: that skip stands.
    assert "skipped" not in " ".join(str(v) for v in out["violations"])


def test_a_docstring_edit_in_the_torch_stage_is_kept(pr_repo: PrRepo) -> None:
    pr_repo.replace(ATTN, "def attend(", "# Explicit attention.\ndef attend(")
    pr_repo.pr("attention")
    code, out, err = pr_repo.verdict()
    assert code == 0, (out.get("violations"), err[-2000:])
    assert _statuses(out)["runtime:cpu"] == "KEPT"


def test_a_new_test_claiming_an_existing_invariant_is_kept(pr_repo: PrRepo) -> None:
    pr_repo.write(
        "packages/mixer/tests/test_mixer_more.py",
        "import pytest\n\nfrom ngt.model.mixer import mix\n\n\n"
        '@pytest.mark.invariant("mixer.averages")\n'
        "def test_mix_keeps_a_constant():\n"
        "    assert mix([3.0, 3.0, 3.0]) == pytest.approx([3.0, 3.0, 3.0])\n",
    )
    pr_repo.pr("mixer")
    code, out, err = pr_repo.verdict()
    assert code == 0, (out.get("violations"), err[-2000:])
    tests_row = next(o for o in out["outcomes"] if o["check"] == "tests:cpu")
    # mixer's and backbone's tests as reference, one skipped as on the base; apart, the
    # PR's version of mixer's tests folder, the new one with the 4 others (tests.removed)
    assert tests_row["summary"] == (
        "5 reference tests pass on the PR's code (1 skipped, as on the base); "
        "5 of the PR's own tests pass (1 skipped, as on the base)"
    )


def test_making_v_required_and_adding_it_elsewhere_is_kept(pr_repo: PrRepo) -> None:
    """Seed 004's own PR: V loses its default; other stages' tests gain V=."""
    core_test = "packages/core/tests/test_config.py"
    pr_repo.replace("packages/core/src/ngt/config.py", "V: int = 256", "V: int")
    pr_repo.replace(core_test, "ModelConfig().T", "ModelConfig(V=256).T")
    pr_repo.replace(core_test, "ModelConfig(T=4)", "ModelConfig(V=256, T=4)")
    pr_repo.replace(MIXER_TEST, "ModelConfig()", "ModelConfig(V=2)")
    pr_repo.pr("backbone_v1")
    code, out, err = pr_repo.verdict()
    assert code == 0, (out.get("violations"), err[-2000:])
    tests_row = next(o for o in out["outcomes"] if o["check"] == "tests:cpu")
    # core's, mixer's and backbone's tests ran: the PR changed core's code.
    assert tests_row["summary"].startswith("7 reference tests pass"), tests_row


def test_a_pending_stage_downstream_does_not_block_a_pr(pr_repo: PrRepo) -> None:
    """A later stage's spec and acceptance tests landed, its package not yet."""
    pr_repo.git("checkout", "-q", "main")
    pr_repo.write(
        "specs/later.toml",
        pr_repo.read("specs/fastpath.toml")
        .replace('id = "fastpath"', 'id = "later"')
        .replace('"packages/fastpath', '"packages/later')
        .replace("ngt-fastpath", "ngt-later")
        .replace("ngt/model/fastpath.py", "ngt/model/later.py")
        .replace("ngt.model.fastpath", "ngt.model.later")
        .replace("fastpath.", "later."),
    )
    pr_repo.write(
        "specs/later/tests/test_later.py",
        "import pytest\n\nfrom ngt.model.later import attend_fast\n\n\n"
        '@pytest.mark.invariant("later.same_as_explicit")\ndef test_x():\n'
        "    assert attend_fast\n",
    )
    pr_repo.commit("the maintainers' side of a later stage")
    pr_repo.git("checkout", "-q", "pr")
    pr_repo.git("merge", "-q", "main")
    pr_repo.replace(ATTN, "def attend(", "# Explicit attention.\ndef attend(")
    pr_repo.pr("attention")
    code, out, err = pr_repo.verdict()
    assert code == 0, (out.get("violations"), err[-2000:])


def test_an_absent_device_is_not_run_or_broken_when_required(pr_repo: PrRepo) -> None:
    """The device is probed by computing on it (no MPS on the machines that run these tests)."""
    pr_repo.replace(MIXER, "def mix(", '"""Mixing."""\n\n\ndef mix(')
    pr_repo.pr("mixer")
    code, out, err = pr_repo.verdict("--device", "mps", "--skip-mutants")
    assert code == 0, (out.get("violations"), err[-2000:])
    rows = {o["check"]: o for o in out["outcomes"]}
    assert rows["device:mps"]["status"] == "NOT RUN"
    assert rows["device:mps"]["summary"].startswith("mps not usable here, tests not run: ")
    assert rows["mutants"]["status"] == "NOT RUN"
    assert "tests:mps" not in rows
    code, out, _ = pr_repo.verdict("--require-device", "mps", "--skip-mutants")
    assert code == 1
    assert [v["rule"] for v in out["violations"]] == ["device.not-run"]


def test_a_relative_python_is_taken_from_the_current_folder(
    pr_repo: PrRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sandbox's runs start in other folders: a relative --python must still
    # name the interpreter it named where the command was typed.
    interpreter = Path(sys.executable)
    monkeypatch.chdir(interpreter.parent)
    pr_repo.replace(MIXER, "def mix(", '"""Mixing."""\n\n\ndef mix(')
    pr_repo.pr("mixer")
    code, out, err = pr_repo.verdict("--python", f"./{interpreter.name}")
    assert code == 0, (out.get("violations"), err[-2000:])


def test_a_python_that_is_not_there_is_an_error_before_any_work(pr_repo: PrRepo) -> None:
    pr_repo.replace(MIXER, "def mix(", '"""Mixing."""\n\n\ndef mix(')
    pr_repo.pr("mixer")
    code, out, err = pr_repo.verdict("--python", "no/such/python")
    assert code == 2 and out["ok"] is False
    assert "expected an executable python interpreter, found none at 'no/such/python'" in err
    assert "sandbox interpreter" not in err  # refused before a workspace was written
