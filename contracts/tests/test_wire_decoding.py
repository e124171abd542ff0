"""What a probe or a report hands back across a process boundary is decoded by type.

Each reader below declares the shape it expects (``msgspec`` structs, through
``decoding``); an answer of the wrong type, with a field missing or with
control characters in it fails closed the way the reader always did (an
empty answer, a ``ConfigError``, a problem line), and what it says is one
printable line.
"""

from __future__ import annotations

import json
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from niels_gpt_contracts import device_probe
from niels_gpt_contracts.checks.code import names
from niels_gpt_contracts.checks.public_api import api
from niels_gpt_contracts.decoding import Malformed
from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.mutants import launcher
from niels_gpt_contracts.sandbox import confine, env_trust, pytest_run, runtime_probe
from niels_gpt_contracts.sandbox.environment import Sandbox
from niels_gpt_contracts.stagespec import ApiEntry, Rule
from niels_gpt_contracts.verdict import repro, testing


def _fake_python(folder: Path, stdout: str, code: int = 0, stderr: str = "") -> str:
    """An executable that prints ``stdout`` (and ``stderr``) whatever it is asked, and
    exits ``code``."""
    path = folder / "fake-python"
    script = f"#!/bin/sh\ncat <<'EOF'\n{stdout}\nEOF\ncat >&2 <<'EOF'\n{stderr}\nEOF\nexit {code}\n"
    path.write_text(script, encoding="utf-8")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return str(path)


# --- sandbox.environment: the interpreter's import path -----------------------


@pytest.mark.parametrize("answer", ['[1, "/usr"]', '{"path": []}', "not json", '"/usr"'])
def test_an_interpreter_whose_import_path_is_not_a_list_of_strings_is_refused(
    tmp_path: Path, answer: str
) -> None:
    python = _fake_python(tmp_path, answer)
    with pytest.raises(ConfigError, match="expected a working interpreter"):
        Sandbox.prepare(python, tmp_path / "sandbox", ["niels_gpt"], 1)


def test_a_real_interpreter_gives_its_import_path(tmp_path: Path) -> None:
    box = Sandbox.prepare(sys.executable, tmp_path / "sandbox", ["niels_gpt"], 1)
    assert box.site_paths() and all(isinstance(p, str) for p in box.site_paths())


# --- sandbox.confine: where the confined interpreter could write --------------


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("42", "expected the places written to: Expected `array`, got `int`"),
        ('["/tmp", 3]', r"Expected `str`, got `int` - at `\$\[1\]`"),
        ("", "expected the places written to: Input data was truncated"),
    ],
)
def test_a_confinement_answer_that_is_not_a_list_of_places_fails_closed(
    tmp_path: Path, answer: str, why: str
) -> None:
    box = Sandbox.prepare(sys.executable, tmp_path / "sandbox", ["niels_gpt"], 1)
    wrapper = _fake_python(tmp_path, answer, stderr="boom \x1b[2J")
    with pytest.raises(ConfigError, match=why) as caught:
        confine._check_writes(Path(wrapper), box, [])
    message = str(caught.value)
    assert message.isprintable() and "\\x1b[2J" in message, message


# --- device_probe: the probing process's verdict ------------------------------


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ('{"ok": "yes", "reason": "fine"}', "Expected `bool`, got `str` - at `$.ok`"),
        ('{"ok": true}', "Object missing required field `reason`"),
        ('{"ok": true, "reason": 7}', "Expected `str`, got `int` - at `$.reason`"),
        ("usable", "JSON is malformed"),
    ],
)
def test_a_device_verdict_of_the_wrong_shape_is_unusable(
    tmp_path: Path, answer: str, why: str
) -> None:
    python = _fake_python(tmp_path, answer, stderr="last words \x1b[2J")
    result = device_probe.probe("cuda", python=python, timeout=30)
    assert not result.ok
    assert result.reason.startswith("cuda probe gave no verdict (expected a verdict: ")
    assert why in result.reason and result.reason.isprintable(), result.reason


def test_a_well_formed_verdict_is_taken_with_its_reason_made_printable(tmp_path: Path) -> None:
    python = _fake_python(tmp_path, '{"ok": true, "reason": "fine\\u001b[2J"}')
    assert device_probe.probe("cuda", python=python, timeout=30) == device_probe.ProbeResult(
        True, "fine?[2J"
    )


# --- sandbox.env_trust: the environment's seal ---------------------------------


def _sealed(tmp_path: Path) -> Path:
    env_dir = tmp_path / "env"
    (env_dir / "lib").mkdir(parents=True)
    (env_dir / "lib" / "mod.py").write_text("x = 1\n", encoding="utf-8")
    (env_dir / "python").symlink_to("/usr/bin/python3")
    env_trust.seal(env_dir)
    return env_dir


def test_a_seal_reads_back_and_finds_a_rewritten_file(tmp_path: Path) -> None:
    env_dir = _sealed(tmp_path)
    written = json.loads(env_trust.manifest_path(env_dir).read_text(encoding="utf-8"))
    assert written["version"] == 1 and set(written["files"]) == {"lib/mod.py", "python"}
    assert set(written["files"]["python"]) == {"stat", "link"}  # no null fields written
    assert env_trust.verify(env_dir) == []
    (env_dir / "lib" / "mod.py").write_text("x = 2\n", encoding="utf-8")
    assert env_trust.verify(env_dir) == ["lib/mod.py"]


@pytest.mark.parametrize(
    "damage",
    [
        lambda m: m.update(version=2),
        lambda m: m.pop("files"),
        lambda m: m["files"]["lib/mod.py"].update(stat="1 2 3 4"),
        lambda m: m["files"]["lib/mod.py"].update(stat=[1, 2, 3]),
        lambda m: m["files"]["lib/mod.py"].update(sha256=["\x1b[2J"]),
    ],
    ids=["version", "no-files", "stat-text", "stat-short", "sha-list"],
)
def test_a_seal_of_another_shape_counts_as_changed(
    tmp_path: Path, damage: Callable[[dict[str, Any]], object]
) -> None:
    env_dir = _sealed(tmp_path)
    path = env_trust.manifest_path(env_dir)
    manifest = json.loads(path.read_text(encoding="utf-8"))
    damage(manifest)
    path.write_text(json.dumps(manifest), encoding="utf-8")
    assert env_trust.verify(env_dir) == ["<manifest>"]


# --- sandbox.runtime_probe: what each runtime rule's driver dispatched ----------


def _rule(n: int) -> Rule:
    return Rule(f"r{n}", "runtime.ops", "msg", {"driver": f"specs/s/d.py:drive{n}"}, 1)


GOOD = {"ops": ["aten::mm"], "casts": [], "blocks": 1, "error": None}


def test_a_runtime_answer_is_read_rule_by_rule() -> None:
    rules = [_rule(1), _rule(2)]
    answer = {runtime_probe.rule_key(r): GOOD for r in rules}
    recorded, problem = runtime_probe.read_answer(0, "noise\n" + json.dumps(answer), "", rules)
    assert problem is None
    assert recorded[runtime_probe.rule_key(rules[1])] == runtime_probe.Recorded(
        ("aten::mm",), (), 1, None
    )


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({**GOOD, "blocks": "1"}, "Expected `int`, got `str` - at `$[...].blocks`"),
        ({**GOOD, "ops": "aten::mm"}, "Expected `array`, got `str` - at `$[...].ops`"),
        ({k: v for k, v in GOOD.items() if k != "error"}, "missing required field `error`"),
        ({**GOOD, "error": 3}, "Expected `str | null`, got `int`"),
    ],
)
def test_a_runtime_answer_of_the_wrong_shape_leaves_every_rule_unchecked(
    entry: dict[str, Any], why: str
) -> None:
    rules = [_rule(1)]
    answer = json.dumps({runtime_probe.rule_key(rules[0]): entry})
    recorded, problem = runtime_probe.read_answer(0, answer, "died \x1b[2J", rules)
    assert recorded == {} and problem is not None
    assert problem.startswith("the runtime probe failed (exit 0, expected a record per rule: ")
    assert why in problem and problem.endswith("died \\x1b[2J"), problem


def test_a_rule_the_probe_did_not_answer_or_a_failed_probe_leaves_every_rule_unchecked() -> None:
    rules = [_rule(1), _rule(2)]
    answer = json.dumps({runtime_probe.rule_key(rules[0]): GOOD})
    _, problem = runtime_probe.read_answer(0, answer, "", rules)
    assert problem == (
        "the runtime probe failed (exit 0, expected a record for "
        "specs/s/d.py:drive2#r2, found none): no output"
    )
    _, problem = runtime_probe.read_answer(1, answer, "Traceback\nOSError: x", rules)
    assert problem == "the runtime probe failed (exit 1, no answer): OSError: x"


# --- sandbox.pytest_run: the plugin's per-test report ----------------------------

REPORT: dict[str, Any] = {
    "device": "cpu",
    "exitstatus": 1,
    "tests": {
        "t.py::a": {"outcome": "passed", "invariants": ["s.i"], "reason": "", "key": "k"},
        "t.py::b": {"outcome": "failed", "invariants": ["s.i"], "reason": "boom", "ops": ["x"]},
    },
    "collected": ["t.py::a", "t.py::b"],
    "invariants": {"s.i": {"passed": 1, "failed": 1, "skipped": 0, "failed_tests": ["t.py::b"]}},
}


def test_a_per_test_report_is_read_with_its_outcomes_and_counts() -> None:
    report = pytest_run._parse(json.dumps(REPORT).encode(), "cpu")
    assert report.tests["t.py::b"] == pytest_run.TestOutcome("failed", ("s.i",), "boom", ("x",))
    assert report.tests["t.py::a"].ops == () and report.collected == ["t.py::a", "t.py::b"]
    assert report.invariants["s.i"] == pytest_run.Counts(1, 1, 0, ("t.py::b",))


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda r: r["tests"]["t.py::a"].update(outcome="xpassed"), "Invalid enum value 'xpassed'"),
        (lambda r: r["tests"]["t.py::a"].update(invariants="s.i"), "Expected `array`, got `str`"),
        (lambda r: r["tests"]["t.py::a"].update(reason=None), "Expected `str`, got `null`"),
        (lambda r: r.pop("collected"), "Object missing required field `collected`"),
        (lambda r: r["invariants"]["s.i"].update(passed="1"), "Expected `int`, got `str`"),
        (lambda r: r.update(device="cuda"), "expected a report for device 'cpu', found 'cuda'"),
        (lambda r: r.update(device="cpu\x1b[2J"), r"found 'cpu\x1b[2J'"),
    ],
)
def test_a_per_test_report_of_the_wrong_shape_is_not_read(
    damage: Callable[[dict[str, Any]], object], why: str
) -> None:
    report = json.loads(json.dumps(REPORT))
    damage(report)
    with pytest.raises(Malformed) as caught:
        pytest_run._parse(json.dumps(report).encode(), "cpu")
    assert why in str(caught.value) and str(caught.value).isprintable(), str(caught.value)


def test_device_counts_add_up_the_runs_of_one_device() -> None:
    counts = pytest_run._parse(json.dumps(REPORT).encode(), "cpu").invariants
    runs = [pytest_run.PytestRun(n, "cpu", 1, 0.0, counts=counts) for n in ("ref", "pr")]
    merged = testing.device_counts(runs).invariants["s.i"]
    assert merged == {"passed": 2, "failed": 2, "skipped": 0, "failed_tests": ["t.py::b"] * 2}


# --- mutants.launcher: the fork server's lines ------------------------------------


def _server(tmp_path: Path, ready: str, reply: str) -> launcher._Server:
    """A stand-in fork server: prints ``ready``, then answers each request with ``reply``."""
    script = tmp_path / "server.py"
    script.write_text(
        "import sys\n"
        f"print({ready!r}, flush=True)\n"
        "for line in sys.stdin:\n"
        f"    print({reply!r}, flush=True)\n",
        encoding="utf-8",
    )
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    return launcher._Server(proc)


@pytest.mark.parametrize(
    ("ready", "reply", "want"),
    [
        ('{"ready": true}', '{"code": 1, "seconds": 0.5}', launcher._Reply(1, 0.5)),
        ('{"ready": true}', '{"code": null, "seconds": 2}', launcher._Reply(None, 2.0)),
        (
            '{"ready": true}',
            '{"code": "1", "seconds": 0.5}',
            "the fork server gave no exit status (expected the exit status of a run: "
            "Expected `int | null`, got `str` - at `$.code`)",
        ),
        (
            '{"ready": true}',
            '{"code": 0}',
            "the fork server gave no exit status (expected the exit status of a run: "
            "Object missing required field `seconds`)",
        ),
        (
            '{"ready": false}',
            "",
            "the fork server died before it was ready (expected the fork server ready: "
            "Invalid enum value False - at `$.ready`)",
        ),
        (
            "Fatal Python error: \x1b[2J",
            "",
            "the fork server died before it was ready (expected the fork server ready: "
            "JSON is malformed: invalid character (byte 0))",
        ),
    ],
)
def test_the_fork_servers_lines_are_decoded_by_type(
    tmp_path: Path, ready: str, reply: str, want: object
) -> None:
    server = _server(tmp_path, ready, reply)
    try:
        assert server.ask({"args": []}) == want
    finally:
        assert server.proc.stdin is not None and server.proc.stdout is not None
        server.proc.stdin.close()
        server.proc.wait(timeout=30)
        server.proc.stdout.close()


# --- checks.code.names: what library names resolve to -----------------------------


def test_resolved_names_are_read_and_judged(tmp_path: Path) -> None:
    answer = {
        "torch.utils.run": {
            "kind": "function",
            "defined_in": "torch.utils",
            "qualname": "run",
            "markers": ["Popen"],
            "generator": False,
            "modules": ["torch", "torch.utils"],
        },
        "torch.nope": {"kind": "missing", "why": "no nope", "modules": ["torch"]},
    }
    found = names.resolve(list(answer), _fake_python(tmp_path, json.dumps(answer)), None)
    assert found["torch.nope"] == names.Resolved("missing", ("torch",), why="no nope")
    assert names.judge_resolved("torch.utils.run", found["torch.utils.run"]) == (
        "torch.utils.run runs programs or loads code (its code uses Popen)"
    )
    assert names.judge_resolved("torch.nope", found["torch.nope"]) is None


@pytest.mark.parametrize(
    ("entry", "why"),
    [
        ({"kind": "callable", "modules": []}, "Invalid enum value 'callable' - at `$[...].kind`"),
        ({"kind": "function"}, "Object missing required field `modules`"),
        ({"kind": "function", "modules": [], "markers": "exec"}, "Expected `array`, got `str`"),
        ({"kind": "other", "modules": [], "generator": 1}, "Expected `bool`, got `int`"),
    ],
)
def test_a_name_probe_answer_of_the_wrong_shape_is_refused(
    tmp_path: Path, entry: dict[str, Any], why: str
) -> None:
    python = _fake_python(tmp_path, json.dumps({"torch.x": entry}))
    with pytest.raises(Malformed, match=r"^the name probe failed: expected an object") as caught:
        names.resolve(["torch.x"], python, None)
    assert why in str(caught.value), str(caught.value)


def test_a_name_probe_that_printed_nothing_or_did_not_start_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Malformed, match="Input data was truncated"):
        names.resolve(["torch.x"], _fake_python(tmp_path, ""), None)
    with pytest.raises(Malformed, match=r"^the name probe failed: .*No such file"):
        names.resolve(["torch.x"], str(tmp_path / "no-python\x1b[2J"), None)


# --- verdict.repro: the reproducer's meta.json -------------------------------------


def _reproducer(tmp_path: Path, meta: object) -> Path:
    (tmp_path / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    return tmp_path / "reproduce.py"


def test_a_reproducers_history_is_counted_and_trimmed_keeping_every_other_field(
    tmp_path: Path,
) -> None:
    from safetensors.numpy import save_file

    script = _reproducer(tmp_path, {"call": "b", "history": [{"call": "a"}, {"call": "z"}]})
    save_file(
        {"history.0.x": np.zeros(1), "history.1.x": np.ones(1)}, tmp_path / "inputs.safetensors"
    )
    assert repro.history_length(script) == 2
    repro.trim(script, 1)
    assert json.loads((tmp_path / "meta.json").read_text()) == {
        "call": "b",
        "history": [{"call": "a"}],
    }
    assert repro.history_length(_reproducer(tmp_path, {"call": "b"})) == 0


@pytest.mark.parametrize(
    ("meta", "why"),
    [
        ([], "Expected `object`, got `array`"),
        ({"history": {"0": {}}}, "Expected `array`, got `object` - at `$.history`"),
        ({"history": ["a\x1b[2J"]}, "Expected `object`, got `str` - at `$.history[0]`"),
    ],
)
def test_a_reproducers_meta_of_the_wrong_shape_is_refused(
    tmp_path: Path, meta: object, why: str
) -> None:
    script = _reproducer(tmp_path, meta)
    with pytest.raises(Malformed, match="expected a reproducer's meta") as caught:
        repro.history_length(script)
    assert why in str(caught.value) and str(caught.value).isprintable(), str(caught.value)


# --- checks.public_api: the import probe's answers ---------------------------------

ENTRIES = [ApiEntry("m:f", "function", "(x: int) -> int", {"run": "(self) -> None"})]
SIG = {"params": [["x", "POSITIONAL_OR_KEYWORD", None, "int"]], "return": "int"}
FOUND: dict[str, Any] = {
    "object": "m:f",
    "kind": "function",
    "file": "m.py",
    "line": 3,
    "signature": SIG,
    "source": None,
    "methods": {"run": {"error": "no method 'run'"}},
}


def test_an_api_answer_is_read_and_judged() -> None:
    (found,) = api.read_answer(0, "noise\n" + json.dumps([FOUND]), "", ENTRIES)
    assert found.signature is not None and found.signature.data() == SIG
    spec = SimpleNamespace(id="s")
    messages = [v.message for v in api.judge(spec, ENTRIES[0], found)]  # type: ignore[arg-type]
    assert messages == ["m:f: expected method run(self) -> None, found: no method 'run'"]


@pytest.mark.parametrize(
    ("damage", "why"),
    [
        (lambda f: f.update(line="3"), "Expected `int | null`, got `str` - at `$[0].line`"),
        (lambda f: f.pop("kind"), "expected a 'kind' or an 'error' for m:f"),
        (lambda f: f["signature"]["params"][0].__setitem__(1, "VARARGS"), "Invalid enum value"),
        (lambda f: f["signature"].pop("return"), "missing required field `return`"),
        (lambda f: f["methods"].update(run={}), "expected a method's 'error' or its 'signature'"),
        (lambda f: f.update(object="m:g"), "expected answers for ['m:f'], found ['m:g']"),
        (lambda f: f.update(object="m:\x1b[2J"), r"found ['m:\x1b[2J']"),
    ],
)
def test_an_api_answer_of_the_wrong_shape_is_a_probe_error_for_every_entry(
    damage: Callable[[dict[str, Any]], object], why: str
) -> None:
    answer = json.loads(json.dumps(FOUND))
    damage(answer)
    (found,) = api.read_answer(0, json.dumps([answer]), "last \x1b[2J", ENTRIES)
    assert found.object == "m:f" and found.probe_error is not None
    assert found.probe_error.startswith("import probe answered something else (expected ")
    assert why in found.probe_error, found.probe_error
    assert found.probe_error.isprintable() and found.probe_error.endswith("last \\x1b[2J")


def test_a_failed_import_probe_is_a_probe_error_for_every_entry() -> None:
    (found,) = api.read_answer(1, "", "Traceback\nImportError: \x1b[2J", ENTRIES)
    assert found.probe_error == "import probe failed (exit 1): ImportError: \\x1b[2J"
