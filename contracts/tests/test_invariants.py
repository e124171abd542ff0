"""Invariant coverage and invariant x device outcomes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from gatekit import Repo, rules

from niels_gpt_contracts import fingerprint

ALPHA_TEST = "packages/alpha/tests/test_alpha.py"


def report(
    repo: Repo,
    path: Path,
    device: str,
    invariants: dict[str, dict[str, int]],
    status: int = 0,
    narrowed: tuple[str, ...] = (),
) -> None:
    """A device report as the plugin writes it, produced from ``repo``'s tree."""
    payload = {
        "device": device,
        "exitstatus": status,
        "source": {
            "tree": fingerprint.tree(repo.root),
            "selection": {"args": ["packages"], "narrowed_by": list(narrowed)},
        },
        "invariants": {
            k: {"passed": 0, "failed": 0, "skipped": 0, "tests": [f"{ALPHA_TEST}::t"], **v}
            for k, v in invariants.items()
        },
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload))


ALL_PASS = {
    "alpha.keeps_length": {"passed": 1},
    "alpha.turns_compose": {"passed": 2},
    "beta.uses_alpha": {"passed": 1},
}


def test_unclaimed_invariant_names_the_spec_line(repo: Repo) -> None:
    repo.replace(ALPHA_TEST, '@pytest.mark.invariant("alpha.turns_compose")\n', "")
    code, out = repo.gate_json("--no-api")
    assert code == 1
    (v,) = out["violations"]
    assert (v["rule"], v["path"], v["line"]) == ("invariant.unclaimed", "specs/alpha.toml", 52)


def test_marker_naming_no_invariant_fails(repo: Repo) -> None:
    repo.replace(
        ALPHA_TEST,
        '"alpha.turns_compose"',
        '"alpha.turns_compose")\n@pytest.mark.invariant("alpha.nope"',
    )
    repo.replace(
        "packages/beta/tests/test_beta.py",
        '"beta.uses_alpha"',
        '"beta.uses_alpha")\n@pytest.mark.invariant("gamma.x"',
    )
    code, out = repo.gate_json("--no-api")
    assert code == 1
    assert {(v["rule"], v["path"], v["line"]) for v in out["violations"]} == {
        ("invariant.unknown", ALPHA_TEST, 14),
        ("invariant.unknown", "packages/beta/tests/test_beta.py", 7),
    }


def test_malformed_marker_fails(repo: Repo) -> None:
    repo.replace(
        ALPHA_TEST, '"alpha.turns_compose"', '"alpha.turns_compose")\n@pytest.mark.invariant(NAME'
    )
    code, out = repo.gate_json("--no-api")
    assert code == 1
    assert rules(out) == {("invariant.malformed", ALPHA_TEST)}


def test_device_reports_all_passing(repo: Repo, tmp_path: Path) -> None:
    report(repo, tmp_path / "r" / "invariants-cpu.json", "cpu", ALL_PASS)
    code, out = repo.gate_json("--no-api", "--reports", str(tmp_path / "r"))
    assert code == 0, out["violations"]
    status = {(o["stage"], o["check"]): o["status"] for o in out["outcomes"]}
    assert status[("alpha", "device:cpu")] == "KEPT"
    # A device without any report is one repository row, not one per stage.
    assert status[("repo", "device:mps")] == "NOT RUN"
    assert status[("repo", "device:cuda")] == "NOT RUN"
    assert ("alpha", "device:mps") not in status
    assert "not run on cuda, mps" in out["summary"]


def test_missing_required_device_is_broken(repo: Repo, tmp_path: Path) -> None:
    report(repo, tmp_path / "r" / "invariants-cpu.json", "cpu", ALL_PASS)
    code, out = repo.gate_json(
        "--no-api", "--reports", str(tmp_path / "r"), "--require-device", "cpu,mps"
    )
    assert code == 1
    assert {v["rule"] for v in out["violations"]} == {"device.not-run"}


def test_failed_invariant_names_the_test_file(repo: Repo, tmp_path: Path) -> None:
    report(
        repo,
        tmp_path / "r" / "invariants-cpu.json",
        "cpu",
        {**ALL_PASS, "alpha.keeps_length": {"passed": 1, "failed": 1}},
        status=1,
    )
    code, out = repo.gate_json("--no-api", "--reports", str(tmp_path / "r"))
    assert code == 1
    assert rules(out) == {("device.failed", ALPHA_TEST)}


def test_skipped_only_is_not_run_never_kept(repo: Repo, tmp_path: Path) -> None:
    report(
        repo, tmp_path / "r" / "invariants-mps.json", "mps", {k: {"skipped": 1} for k in ALL_PASS}
    )
    code, out = repo.gate_json("--no-api", "--reports", str(tmp_path / "r"))
    assert code == 0
    mps = [o for o in out["outcomes"] if o["check"] == "device:mps"]
    assert {o["status"] for o in mps} == {"NOT RUN"}
    code, out = repo.gate_json(
        "--no-api", "--reports", str(tmp_path / "r"), "--require-device", "mps"
    )
    assert code == 1


def test_errored_run_with_unverified_invariants_is_broken(repo: Repo, tmp_path: Path) -> None:
    report(
        repo,
        tmp_path / "r" / "invariants-cpu.json",
        "cpu",
        {"beta.uses_alpha": {"passed": 1}},
        status=2,
    )
    code, out = repo.gate_json("--no-api", "--reports", str(tmp_path / "r"))
    assert code == 1
    assert {v["rule"] for v in out["violations"]} == {"device.incomplete"}
    assert out["stages"] == {"alpha": "BROKEN", "beta": "KEPT"}


def test_malformed_report_is_a_config_error(repo: Repo, tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "invariants-cpu.json").write_text("{not json")
    code, _, err = repo.gate("--no-api", "--reports", str(tmp_path / "r"))
    assert code == 2
    assert "invariants-cpu.json:1: expected JSON" in err


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        ({"device": "cpu", "invariants": {"a.b": {"passed": "1"}}},
         "Expected `int`, got `str` - at `$.invariants[...].passed`"),
        ({"device": "cpu\n::error::x", "invariants": {}},
         "Invalid enum value 'cpu\\n::error::x' - at `$.device`"),
        ({"device": "cpu", "invariants": {}, "source": {"tree": 1, "selection": {}}},
         "Expected `str`, got `int` - at `$.source.tree`"),
        ({"device": "cpu", "invariants": {}, "format": 2, "sections": {"a": {"collected": 3}}},
         "Expected `array`, got `int` - at `$.sections[...].collected`"),
        ({"device": "cpu"}, "Object missing required field `invariants`"),
    ],
    ids=["count", "device", "tree", "collected", "missing"],
)  # fmt: skip
def test_a_report_of_the_wrong_shape_exits_2_with_its_reason_on_one_line(
    repo: Repo, tmp_path: Path, payload: dict[str, object], reason: str
) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "invariants-cpu.json").write_text(json.dumps(payload))
    code, _, err = repo.gate("--no-api", "--reports", str(tmp_path / "r"))
    assert code == 2
    line = next(x for x in err.splitlines() if "invariants-cpu.json" in x)
    assert line.endswith(f"invariants-cpu.json: expected an invariant report: {reason}"), err


def test_package_without_spec_and_its_claims_are_flagged(repo: Repo) -> None:
    repo.write("packages/gamma/pyproject.toml", '[project]\nname = "ngx-gamma"\n')
    repo.write(
        "packages/gamma/tests/test_g.py", '@pytest.mark.invariant("gamma.x")\ndef test_g(): ...\n'
    )
    code, out = repo.gate_json("--no-api")
    assert code == 1
    assert {(v["rule"], v["path"], v["line"]) for v in out["violations"]} == {
        ("stage.unspecified", "packages/gamma/pyproject.toml", None),
        ("invariant.unknown", "packages/gamma/tests/test_g.py", 1),
    }
    assert out["stages"] == {"alpha": "KEPT", "beta": "KEPT"}
    assert "BROKEN (repo)" in out["summary"]


def test_plugin_report_feeds_the_gate(repo: Repo, tmp_path: Path) -> None:
    # The run tests the repository's own tree, so its report is not stale.
    tests = repo.root / "packages" / "alpha" / "tests" / "test_claims.py"
    tests.write_text(
        "import pytest\n\n"
        '@pytest.mark.invariant("alpha.keeps_length")\ndef test_ok():\n    pass\n\n'
        '@pytest.mark.invariant("alpha.keeps_length")\ndef test_bad():\n    assert False\n\n'
        '@pytest.mark.invariant("alpha.turns_compose")\ndef test_skip():\n    pytest.skip()\n\n'
        '@pytest.mark.invariant("beta.uses_alpha")\ndef test_beta():\n    pass\n'
    )
    out = tmp_path / "invariants-cpu.json"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "--rootdir",
            str(repo.root),
            "--confcutdir",
            str(tests.parent),
            str(tests),
            f"--invariant-report={out}",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=repo.root,
    )
    assert done.returncode == 1, done.stdout
    data = json.loads(out.read_text())
    (failed_id,) = data["invariants"]["alpha.keeps_length"]["failed_tests"]
    assert failed_id.endswith("::test_bad")
    code, result = repo.gate_json("--no-api", "--report", str(out))
    assert code == 1
    found = {(v["rule"], v["check"]) for v in result["violations"]}
    assert found == {("device.failed", "device:cpu")}
    failed = next(v for v in result["violations"] if v["rule"] == "device.failed")
    assert failed["message"].endswith("::test_bad")
    assert result["stages"] == {"alpha": "BROKEN", "beta": "KEPT"}


def test_a_stage_whose_package_is_not_there_yet_is_pending(repo: Repo) -> None:
    """The maintainers' spec and acceptance tests land before the stage's first PR."""
    repo.write(
        "specs/gamma.toml",
        repo.read("specs/alpha.toml")
        .replace('id = "alpha"', 'id = "gamma"')
        .replace('"packages/alpha"', '"packages/gamma"')
        .replace("ngx-alpha", "ngx-gamma")
        .replace("ngx/alpha_mod.py", "ngx/gamma_mod.py")
        .replace("ngx.alpha_mod", "ngx.gamma_mod")
        .replace("packages/alpha/", "packages/gamma/"),
    )
    repo.write(
        "specs/gamma/tests/test_gamma.py",
        "import pytest\n\n\n"
        '@pytest.mark.invariant("gamma.keeps_length")\ndef test_a():\n    pass\n\n\n'
        '@pytest.mark.invariant("gamma.turns_compose")\ndef test_b():\n    pass\n',
    )
    code, out = repo.gate_json()
    assert code == 0, out["violations"]
    gamma = [o for o in out["outcomes"] if o["stage"] == "gamma"]
    assert [(o["check"], o["status"]) for o in gamma] == [("spec", "KEPT"), ("stage", "NOT RUN")]
    assert gamma[1]["summary"].startswith("pending: packages/gamma does not exist yet")


def test_a_report_from_another_tree_is_stale(repo: Repo, tmp_path: Path) -> None:
    report(repo, tmp_path / "r" / "invariants-cpu.json", "cpu", ALL_PASS)
    repo.replace("packages/alpha/src/ngx/alpha_mod.py", "n = turns % len(x)", "n = 0")
    code, out = repo.gate_json("--no-api", "--reports", str(tmp_path / "r"))
    assert code == 0  # not required: NOT RUN, never KEPT
    rows = {(o["stage"], o["check"]): o for o in out["outcomes"]}
    assert rows[("alpha", "device:cpu")]["status"] == "NOT RUN"
    assert "produced from another tree" in rows[("alpha", "device:cpu")]["summary"]
    code, out = repo.gate_json(
        "--no-api", "--reports", str(tmp_path / "r"), "--require-device", "cpu"
    )
    assert code == 1
    assert {v["rule"] for v in out["violations"]} == {"device.stale"}


def test_a_narrowed_or_old_report_proves_nothing(repo: Repo, tmp_path: Path) -> None:
    report(repo, tmp_path / "r" / "invariants-cpu.json", "cpu", ALL_PASS, narrowed=("-k rope",))
    code, out = repo.gate_json(
        "--no-api", "--reports", str(tmp_path / "r"), "--require-device", "cpu"
    )
    assert code == 1
    assert {v["rule"] for v in out["violations"]} == {"device.partial"}
    assert "-k rope" in out["violations"][0]["message"]
    old = tmp_path / "r" / "invariants-cpu.json"
    data = json.loads(old.read_text())
    del data["source"]
    old.write_text(json.dumps(data))
    code, out = repo.gate_json("--no-api", "--reports", str(tmp_path / "r"))
    rows = {(o["stage"], o["check"]): o for o in out["outcomes"]}
    assert rows[("alpha", "device:cpu")]["status"] == "NOT RUN"
    assert "does not say what it was produced from" in rows[("alpha", "device:cpu")]["summary"]
