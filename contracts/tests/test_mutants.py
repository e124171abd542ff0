"""The mutant gate on a tiny torch-free stage in a temporary git repository.

The stage ``tiny`` owns ``packages/tiny/src/ngt/tinymod.py`` (``ngt`` is a PEP
420 namespace, like ``niels_gpt``); its tests claim ``tiny.*`` invariants. The
catalogue holds one mutant of each kind: killed, surviving, stale, one that
breaks the import, and one that hangs.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from gatekit import valid_report

from niels_gpt_contracts.cli import main
from niels_gpt_contracts.mutants import zygote

SCHEMA = Path(__file__).resolve().parents[2] / "specs" / "spec.schema.json"
MODULE = "packages/tiny/src/ngt/tinymod.py"

SOURCE = """\
def add(a, b):
    return a + b


def scale(x):
    return x * 2


def spare():
    return "spare"
"""

TESTS = """\
import pytest

from ngt.tinymod import add, scale


@pytest.mark.invariant("tiny.adds")
def test_add():
    assert add(2, 3) == 5


@pytest.mark.invariant("tiny.scales")
def test_scale():
    assert scale(4) == 8


def test_claims_nothing_so_the_gate_never_runs_it():
    raise AssertionError("deselected by --invariant-prefix")
"""

SPEC = """\
schema_version = 3
version = "1.0.0"
id = "tiny"
title = "Tiny stage"
package = "packages/tiny"
distribution = "ngt-tiny"
depends_on = []
modules = ["ngt/tinymod.py"]
api = []
rules = []

[paths]
may_change = ["packages/tiny/**"]

[[invariants]]
id = "adds"
text = "add adds."

[[invariants]]
id = "scales"
text = "scale doubles."
"""


def mutant(mid: str, find: str, replace: str, **extra: object) -> str:
    lines = [
        "",
        "[[mutants]]",
        f'id = "{mid}"',
        f'text = "The {mid} bug."',
        f'file = "{MODULE}"',
        f"find = {json.dumps(find)}",
        f"replace = {json.dumps(replace)}",
        *(f"{k} = {json.dumps(v)}" for k, v in extra.items()),
    ]
    return "\n".join(lines) + "\n"


CATALOGUE = (
    mutant("minus", "a + b", "a - b")
    + mutant("untested", '"spare"', '"other"')
    + mutant("gone", "a * b", "a / b")
    + mutant("import-breaks", "def spare():", 'raise ImportError("boom")\n\n\ndef spare():')
    + mutant("hangs", "return x * 2", "import time\n    time.sleep(60)\n    return x * 2")
)


def _git(root: Path, *args: str) -> None:
    subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)


@pytest.fixture
def tiny(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = tmp_path / "repo"
    files = {
        "specs/tiny.toml": SPEC + CATALOGUE,
        MODULE: SOURCE,
        "packages/tiny/tests/test_tiny.py": TESTS,
        "pyproject.toml": '[tool.pytest.ini_options]\naddopts = ["--import-mode=importlib"]\n',
    }
    for path, text in files.items():
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(text)
    shutil.copy(SCHEMA, root / "specs" / "spec.schema.json")
    _git(root, "init", "-q")
    monkeypatch.setenv("PYTHONPATH", str(root / "packages/tiny/src"))
    return root


def gate(root: Path, *args: str) -> tuple[int, dict[str, Any]]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["mutants", "--repo", str(root), "--format", "json", *args])
    return code, valid_report(out.getvalue())


def statuses(payload: dict[str, Any]) -> dict[str, tuple[str, bool]]:
    return {m["id"]: (m["status"], m["cached"]) for m in payload["mutants"]}


def test_each_kind_of_verdict_and_the_working_tree_untouched(
    tiny: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = tiny / "specs/tiny.toml"
    # "return" occurs three times: "second" picks one, "ambiguous" is stale.
    spec.write_text(
        spec.read_text()
        + mutant("second", "return", "return -1 *", occurrence=2)
        + mutant("ambiguous", "return", "return -1 *")
    )
    picked = ("minus", "untested", "gone", "import-breaks", "second", "ambiguous")
    code = main(["mutants", "--repo", str(tiny), *(f"--mutant={m}" for m in picked)])
    lines = capsys.readouterr().out.splitlines()
    assert code == 1
    verdicts = [line for line in lines if line.startswith("MUTANT ")]
    assert [v.split(" (")[0] for v in verdicts] == [
        "MUTANT tiny.minus killed",
        "MUTANT tiny.untested survived",
        "MUTANT tiny.gone stale",
        "MUTANT tiny.import-breaks killed",
        "MUTANT tiny.second killed",
        "MUTANT tiny.ambiguous stale",
    ]
    assert "failed: " in verdicts[0] and "test_add" in verdicts[0]
    assert "collection" in verdicts[3]
    assert "test_scale" in verdicts[4]
    assert "expected once" in verdicts[2] and "3 times" in verdicts[5]
    assert "  tiny.untested: The untested bug." in lines
    assert lines[-1] == "killed 3/6 (1 survived, 2 stale)"
    assert (tiny / MODULE).read_text() == SOURCE


def test_json_report_and_cached_kills(tiny: Path) -> None:
    code, out = gate(tiny, "--mutant", "minus", "--mutant", "tiny.gone")
    assert code == 1
    assert statuses(out) == {"minus": ("killed", False), "gone": ("stale", False)}
    assert (out["killed"], out["total"], out["summary"]) == (1, 2, "killed 1/2 (1 stale)")
    [violation] = out["violations"]
    assert violation["rule"] == "mutant.stale" and violation["path"] == "specs/tiny.toml"
    assert violation["line"] is not None and violation["stage"] == "tiny"
    assert out["clean"][0]["ok"] and out["clean"][0]["tests"] == [
        "packages/tiny/tests/test_tiny.py"
    ]
    code, out = gate(tiny, "--mutant", "minus")
    assert (code, statuses(out)) == (0, {"minus": ("killed", True)})
    assert out["clean"] == []  # nothing to run, so no clean run either
    code, out = gate(tiny, "--mutant", "minus", "--all")
    assert (code, statuses(out)) == (0, {"minus": ("killed", False)})
    # A change to the stage's tests invalidates the cached kill.
    test_file = tiny / "packages/tiny/tests/test_tiny.py"
    test_file.write_text(test_file.read_text() + "\n# touched\n")
    code, out = gate(tiny, "--mutant", "minus")
    assert statuses(out) == {"minus": ("killed", False)}


@pytest.mark.parametrize("launch", ["--jobs=2", "--no-fork"])
def test_a_hanging_mutant_is_an_error_not_a_kill(tiny: Path, launch: str) -> None:
    # The limit bounds every run, the clean one included: 3 s was too tight for a fresh
    # pytest process (--no-fork) on a 2-core machine at load 11 (an exit 2 seen once);
    # 10 s leaves a margin and stays far below the hang (60 s, asleep: no CPU).
    code, out = gate(tiny, "--mutant", "hangs", "--mutant", "minus", "--timeout", "10", launch)
    assert code == 1
    assert statuses(out) == {"minus": ("killed", False), "hangs": ("error", False)}
    assert "timeout" in out["mutants"][1]["reason"]
    assert "test_add" in out["mutants"][0]["reason"]


def test_a_failing_clean_run_is_a_configuration_error(tiny: Path) -> None:
    (tiny / MODULE).write_text(SOURCE.replace("x * 2", "x * 3"))
    code, out = gate(tiny, "--mutant", "minus")
    assert code == 2 and "clean test run must pass" in out["error"]


def test_unknown_stage_and_malformed_catalogue(tiny: Path) -> None:
    code, out = gate(tiny, "--stage", "nope")
    assert code == 2 and "unknown stage 'nope'" in out["error"]
    spec = tiny / "specs/tiny.toml"
    spec.write_text(spec.read_text() + mutant("minus", "a + b", "a * b"))
    code, out = gate(tiny)
    assert code == 2 and "expected a unique id" in out["error"]
    spec.write_text(SPEC + mutant("bad", "a + b", "a +* b"))
    code, out = gate(tiny)
    assert code == 1 and statuses(out) == {"bad": ("error", False)}
    assert "does not compile" in out["mutants"][0]["reason"]


def test_the_zygote_keeps_pythonpath_first_under_safe_path(tmp_path: Path) -> None:
    """Under -P/PYTHONSAFEPATH, sys.path[0] is PYTHONPATH's first entry, not the
    zygote's folder; the zygote must not drop it (the sandbox's bootstrap is there)."""
    first = tmp_path / "first"
    first.mkdir()
    test = tmp_path / "test_path.py"
    test.write_text(
        "import os, sys\n\n\ndef test_first():\n"
        "    assert sys.path[0] == os.environ['EXPECT'], sys.path[:3]\n"
    )
    request = {
        "overlay": "",
        "module": "",
        "want": "",
        "args": ["-q", "-p", "no:cacheprovider", "--import-mode=importlib", str(test)],
    }
    env = {**os.environ, "PYTHONSAFEPATH": "1", "PYTHONPATH": str(first), "EXPECT": str(first)}
    done = subprocess.run(
        [sys.executable, str(zygote.__file__), "--once", json.dumps(request)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]


# --- hints: the test that killed a mutant before runs first, and proves nothing alone ---


def _hints(root: Path, hints: dict[str, str]) -> None:
    from niels_gpt_contracts.mutants.hints import HINTS_PATH, render

    (root / HINTS_PATH).write_text(render(hints))


def test_write_hints_records_the_killing_test_and_a_hint_runs_it_alone(tiny: Path) -> None:
    code, out = gate(tiny, "--mutant", "minus", "--write-hints")
    assert code == 0
    written = json.loads((tiny / "specs/mutant-hints.json").read_text())["hints"]
    assert written == {"tiny.minus": "packages/tiny/tests/test_tiny.py::test_add"}
    (tiny / ".mutants-cache.json").unlink()  # a fresh clone: only the committed hints
    code, out = gate(tiny, "--mutant", "minus")
    assert (code, statuses(out)) == (0, {"minus": ("killed", False)})
    # The clean run was of the hinted test alone, and so was the mutant's run.
    assert out["clean"] == [
        {**out["clean"][0], "tests": ["packages/tiny/tests/test_tiny.py::test_add"]}
    ]
    assert "test_add" in out["mutants"][0]["reason"]


def test_a_wrong_hint_costs_a_run_and_the_full_run_decides(tiny: Path) -> None:
    # test_scale passes on the minus mutant: the hint does not kill it.
    _hints(tiny, {"tiny.minus": "packages/tiny/tests/test_tiny.py::test_scale"})
    code, out = gate(tiny, "--mutant", "minus")
    assert (code, statuses(out)) == (0, {"minus": ("killed", False)})
    assert "test_add" in out["mutants"][0]["reason"]
    # The hinted test ran clean, then the whole suite (the full run that killed it).
    assert [(c["ok"], c["tests"]) for c in out["clean"]] == [
        (True, ["packages/tiny/tests/test_tiny.py::test_scale"]),
        (True, ["packages/tiny/tests/test_tiny.py"]),
    ]
    stored = json.loads((tiny / ".mutants-cache.json").read_text())["kills"]["tiny.minus"]
    assert stored["test"] == "packages/tiny/tests/test_tiny.py::test_add"


def test_a_hint_that_is_no_test_never_counts_as_a_kill(tiny: Path) -> None:
    """pytest exits 4 for a node id it cannot find, as for a module that raises on
    import; a hint must pass clean before its failure on a mutant means anything."""
    _hints(
        tiny,
        {
            "tiny.untested": "packages/tiny/tests/test_tiny.py::test_gone",
            "tiny.minus": "packages/tiny/tests/test_tiny.py::test_add",
        },
    )
    code, out = gate(tiny, "--mutant", "untested", "--mutant", "minus")
    assert code == 1
    assert statuses(out) == {"untested": ("survived", False), "minus": ("killed", False)}
    # The id that is no test was dropped before any run: only test_add ran clean as a hint.
    assert [(c["ok"], c["tests"]) for c in out["clean"]] == [
        (True, ["packages/tiny/tests/test_tiny.py::test_add"]),
        (True, ["packages/tiny/tests/test_tiny.py"]),
    ]


def test_stop_early_leaves_the_rest_not_run_and_never_killed(tiny: Path) -> None:
    from niels_gpt_contracts.mutants import fates, runner

    opts = runner.Options(repo=tiny, only=["untested", "minus", "second"], jobs=1, stop_early=True)
    spec = tiny / "specs/tiny.toml"
    spec.write_text(spec.read_text() + mutant("second", "return", "return -1 *", occurrence=2))
    result = runner.run(opts)
    # In catalogue order, one run at a time: minus dies, untested survives, second waits.
    assert [(v.mutant.id, v.status) for v in result.fates] == [
        ("minus", "killed"),
        ("untested", "survived"),
    ]
    assert [m.id for m in result.not_run] == ["second"]
    assert not result.ok
    assert fates.summary(result) == (
        "killed 1/2 (1 survived); 1 not run (stopped at the first mutant not killed)"
    )


# --- proof keys: what a kill depends on ------------------------------------------------


def test_a_docstring_or_comment_edit_keeps_the_proof_and_a_code_edit_does_not(
    tiny: Path,
) -> None:
    assert statuses(gate(tiny, "--mutant", "minus")[1]) == {"minus": ("killed", False)}
    module = tiny / MODULE
    module.write_text(
        '"""Tiny."""\n\n# sums\n'
        + SOURCE.replace("    return x * 2", "    # twice\n    return x * 2")
    )
    assert statuses(gate(tiny, "--mutant", "minus")[1]) == {"minus": ("killed", True)}
    # Another module of the stages, never mutated, still decides the kill.
    other = tiny / "packages/tiny/src/ngt/helper.py"
    other.write_text("VALUE = 1\n")
    assert statuses(gate(tiny, "--mutant", "minus")[1]) == {"minus": ("killed", False)}
    other.write_text('"""Helper."""\nVALUE = 1  # one\n')
    assert statuses(gate(tiny, "--mutant", "minus")[1]) == {"minus": ("killed", True)}
    other.write_text("VALUE = 2\n")
    assert statuses(gate(tiny, "--mutant", "minus")[1]) == {"minus": ("killed", False)}


def test_code_that_reads_docstrings_makes_every_text_count(tiny: Path) -> None:
    module = tiny / MODULE
    module.write_text(SOURCE + "\n\ndef doc():\n    return add.__doc__\n")
    assert statuses(gate(tiny, "--mutant", "minus")[1]) == {"minus": ("killed", False)}
    module.write_text('"""Tiny."""\n' + SOURCE + "\n\ndef doc():\n    return add.__doc__\n")
    assert statuses(gate(tiny, "--mutant", "minus")[1]) == {"minus": ("killed", False)}


def test_a_mutant_marked_for_retargeting_fails_the_gate_unrun(tiny: Path) -> None:
    """A ``retarget`` mark is for one PR's verdict: on a tree (main) it is a failure."""
    spec = tiny / "specs/tiny.toml"
    spec.write_text(SPEC + mutant("minus", "a + b", "a - b", retarget=True))
    code, out = gate(tiny)
    assert code == 1
    assert statuses(out) == {"minus": ("pending", False)}
    assert out["summary"] == "killed 0/1 (1 pending)" and out["clean"] == []
    [violation] = out["violations"]
    assert violation["rule"] == "mutant.pending" and "re-target it" in violation["message"]


def check_tree(root: Path) -> tuple[int, dict[str, Any]]:
    """``contracts check`` of ``root``'s working tree, its JSON report."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["check", "--repo", str(root), "--no-api", "--format", "json"])
    return code, valid_report(out.getvalue())


def test_a_tree_check_refuses_a_mutant_its_code_left_behind_and_counts_a_marked_one(
    tiny: Path,
) -> None:
    code, out = check_tree(tiny)
    [row] = [o for o in out["outcomes"] if o["check"] == "mutants"]
    assert code == 1 and row["status"] == "BROKEN", row
    # "gone": its find text "a * b" is nowhere in the module
    [stale] = [v for v in out["violations"] if v["check"] == "mutants"]
    assert stale["rule"] == "mutant.stale" and "mutant gone tests nothing" in stale["message"]
    assert stale["path"] == "specs/tiny.toml" and stale["line"] is not None
    spec = tiny / "specs/tiny.toml"
    marked = mutant("gone", "a * b", "a / b", retarget=True)
    spec.write_text(spec.read_text().replace(mutant("gone", "a * b", "a / b"), marked))
    code, out = check_tree(tiny)
    [row] = [o for o in out["outcomes"] if o["check"] == "mutants"]
    assert row["status"] == "KEPT", row
    assert row["summary"] == "4 mutant(s) find their text in the code; 1 marked for re-targeting"
