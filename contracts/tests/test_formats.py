"""The reporters render one result model: text, JSON, JUnit, SARIF, GitHub."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

from gatekit import Repo

PR = ("--stage", "alpha", "--base", "main", "--head", "HEAD", "--no-api")


def broken(repo: Repo) -> None:
    repo.write("README.md", "edited\n")
    repo.write("packages/beta/a b ü.txt", "x\n")
    repo.write(
        "packages/alpha/pyproject.toml",
        repo.read("packages/alpha/pyproject.toml").replace(
            "dependencies = []", 'dependencies = ["numpy"]'
        ),
    )
    repo.commit()


def test_text_has_a_row_per_stage_and_check_and_a_summary(repo: Repo) -> None:
    code, out, _ = repo.gate("--no-api")
    assert code == 0
    lines = out.splitlines()
    rows = [line for line in lines[:-1] if line.startswith(("KEPT", "BROKEN", "NOT RUN"))]
    # spec, modules, source, static, invariants per stage, and the repo row
    assert len(rows) == 2 * 5 + 1
    assert lines[-1].startswith("KEPT: 2 stages, 2 KEPT, 0 BROKEN")


def test_json_fields(repo: Repo) -> None:
    broken(repo)
    code, out = repo.gate_json(*PR)
    assert code == 1 and out["ok"] is False
    for v in out["violations"]:
        assert {"rule", "path", "line", "message"} <= set(v)
    assert ("static.dependencies", "packages/alpha/pyproject.toml", 4) in {
        (v["rule"], v["path"], v["line"]) for v in out["violations"]
    }


def test_sarif(repo: Repo) -> None:
    broken(repo)
    code, out, _ = repo.gate(*PR, "--format", "sarif")
    assert code == 1
    doc = json.loads(out)
    assert doc["version"] == "2.1.0"
    run = doc["runs"][0]
    ids = [r["id"] for r in run["tool"]["driver"]["rules"]]
    assert "path.not-allowed" in ids and "static.dependencies/alpha" in ids
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]
    }
    assert "packages/beta/a%20b%20%C3%BC.txt" in uris
    for result in run["results"]:
        assert ids[result["ruleIndex"]] == result["ruleId"]


def test_sarif_rule_ids_are_stable(repo: Repo) -> None:
    _, first, _ = repo.gate("--no-api", "--format", "sarif")
    broken(repo)
    _, second, _ = repo.gate(*PR, "--format", "sarif")
    rules_of = [
        [r["id"] for r in json.loads(x)["runs"][0]["tool"]["driver"]["rules"]]
        for x in (first, second)
    ]
    assert set(rules_of[0]) <= set(rules_of[1]) or set(rules_of[1]) <= set(rules_of[0])


def test_github_annotations_changed_lines_first_and_summary_last(repo: Repo) -> None:
    broken(repo)
    code, out, _ = repo.gate(*PR, "--format", "github")
    assert code == 1
    lines = out.splitlines()
    errors = [line for line in lines if line.startswith("::error file=")]
    assert errors[0].startswith("::error file=packages/alpha/pyproject.toml,line=4,")
    assert any("file=packages/beta/a b ü.txt" in e for e in errors)
    assert lines[-1].startswith("::error title=contracts::BROKEN")


def test_junit(repo: Repo) -> None:
    broken(repo)
    code, out, _ = repo.gate(*PR, "--format", "junit")
    assert code == 1
    root = ET.fromstring(out.split("?>", 1)[1])
    assert len(root.findall(".//failure")) == 2
    assert sum(int(s.get("failures", "0")) for s in root.findall("testsuite")) == 2


def test_a_verdict_stopped_early_does_not_call_its_devices_skipped() -> None:
    """Device rows left NOT RUN because the verdict stopped at an earlier BROKEN row
    say nothing of the device: the summary says it stopped, not 'a skip is not a pass'."""
    from niels_gpt_contracts.reporters.common import summary
    from niels_gpt_contracts.result import STOPPED, Outcome, Result, Violation

    result = Result(mode="pr", stages=["s"], base="a" * 40, head="b" * 40)
    found = [Violation("protocol.hooks", "x.py", None, "hooks", "s", "protocol")]
    result.outcomes += [
        Outcome("s", "protocol", "BROKEN", "1 violation(s)", found),
        Outcome("s", "device:cpu", "NOT RUN", f"{STOPPED} (protocol); --full runs it"),
    ]
    text = summary(result)
    assert "a skip is not a pass" not in text
    assert "stopped at the first BROKEN row" in text
    result.outcomes.append(Outcome("s", "device:mps", "NOT RUN", "mps not usable here"))
    assert "not run on mps (a skip is not a pass)" in summary(result)
