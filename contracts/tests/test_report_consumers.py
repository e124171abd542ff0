"""Each report format judged by the schema its consumers use, not by us.

- SARIF: the OASIS SARIF 2.1.0 JSON schema (Errata 01), plus what GitHub
  code scanning requires beyond it: rules with ``fullDescription`` and
  ``help``, a driver ``version``, a location with a start line on every
  result, distinct fingerprints for distinct violations.
- JUnit: the Jenkins xUnit ``junit-10.xsd``, through ``xmlschema``.
- JSON: ``specs/report.schema.json`` (every JSON report the tests read is
  checked in ``gatekit.valid_report``; here the schema itself).

The vendored schemas are in ``data/`` (sources and licences in its README).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import xmlschema
from gatekit import REPORT_SCHEMA, Repo, valid_report
from jsonschema import Draft4Validator, Draft202012Validator

from niels_gpt_contracts.reporters import junit, sarif
from niels_gpt_contracts.result import (
    BROKEN,
    KEPT,
    NOT_RUN,
    REPORT_SCHEMA_VERSION,
    Outcome,
    Result,
    SpecRule,
    Violation,
)

DATA = Path(__file__).resolve().parent / "data"
VENDORED = {
    "sarif-schema-2.1.0.json": "c3b4bb2d6093897483348925aaa73af03b3e3f4bd4ca38cef26dcb4212a2682e",
    "junit-10.xsd": "a1a816f58d1bf95ebabf371994df0b9246dee66ea9572fbec4f9296f1b2c0ff6",
}
PR = ("--stage", "alpha", "--base", "main", "--head", "HEAD", "--no-api")
HOSTILE = ("a b ü.txt", "100%.txt", "cr\r.txt", "lf\n.txt", "ctl\x01\x1b[31m.txt", "::x::y.md")


@pytest.fixture(scope="module")
def sarif_schema() -> Draft4Validator:
    schema = json.loads((DATA / "sarif-schema-2.1.0.json").read_text(encoding="utf-8"))
    Draft4Validator.check_schema(schema)
    return Draft4Validator(schema, format_checker=Draft4Validator.FORMAT_CHECKER)


@pytest.fixture(scope="module")
def junit_schema() -> xmlschema.XMLSchema10:
    return xmlschema.XMLSchema10(str(DATA / "junit-10.xsd"))


def valid_sarif(validator: Draft4Validator, text: str) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(text)
    errors = [f"{'/'.join(map(str, e.path))}: {e.message}" for e in validator.iter_errors(doc)]
    assert not errors, errors
    for run in doc["runs"]:  # GitHub code scanning's requirements beyond the schema
        driver = run["tool"]["driver"]
        assert driver["name"] and driver["version"]
        ids = [r["id"] for r in driver["rules"]]
        assert len(ids) == len(set(ids))
        for rule in driver["rules"]:
            for key in ("shortDescription", "fullDescription", "help"):
                assert rule[key]["text"].strip(), (rule["id"], key)
        prints = set()
        for res in run["results"]:
            assert ids[res["ruleIndex"]] == res["ruleId"]
            (location,) = res["locations"]
            physical = location["physicalLocation"]
            assert physical["artifactLocation"]["uri"] and physical["region"]["startLine"] >= 1
            prints.add(json.dumps(res["partialFingerprints"], sort_keys=True))
        assert len(prints) == len(run["results"]), "two results share a fingerprint"
    return doc


def allowed(repo: Repo) -> None:
    """A PR change the alpha stage may make (a PR must change something)."""
    repo.write("packages/alpha/README.md", "alpha\n")
    repo.commit()


def broken(repo: Repo) -> None:
    for name in HOSTILE:
        repo.write(name, "x\n")
    repo.replace("packages/alpha/pyproject.toml", "dependencies = []", 'dependencies = ["numpy"]')
    repo.commit()


def test_vendored_schemas_are_the_upstream_files() -> None:
    for name, digest in VENDORED.items():
        assert hashlib.sha256((DATA / name).read_bytes()).hexdigest() == digest, name


def test_sarif_of_a_broken_pr_is_valid_for_github(
    repo: Repo, sarif_schema: Draft4Validator
) -> None:
    broken(repo)
    code, out, _ = repo.gate(*PR, "--format", "sarif")
    assert code == 1
    doc = valid_sarif(sarif_schema, out)
    uris = {
        r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        for r in doc["runs"][0]["results"]
    }
    assert {
        "a%20b%20%C3%BC.txt",
        "100%25.txt",
        "cr%0D.txt",
        "lf%0A.txt",
        "%3A%3Ax%3A%3Ay.md",
    } <= uris


@pytest.mark.parametrize("args", [("--no-api",), PR])
def test_sarif_of_a_kept_run_is_valid(
    repo: Repo, sarif_schema: Draft4Validator, args: tuple[str, ...]
) -> None:
    allowed(repo)
    code, out, _ = repo.gate(*args, "--format", "sarif")
    assert code == 0
    assert valid_sarif(sarif_schema, out)["runs"][0]["results"] == []


def test_sarif_of_an_error_is_valid(repo: Repo, sarif_schema: Draft4Validator) -> None:
    code, out, _ = repo.gate("--stage", "nope", "--no-api", "--format", "sarif")
    assert code == 2
    (invocation,) = valid_sarif(sarif_schema, out)["runs"][0]["invocations"]
    assert invocation["executionSuccessful"] is False


def test_sarif_keeps_each_stages_own_rule_text(repo: Repo, sarif_schema: Draft4Validator) -> None:
    """alpha and beta both define static.dependencies, with different texts."""
    repo.replace("packages/alpha/pyproject.toml", "dependencies = []", 'dependencies = ["numpy"]')
    code, out, _ = repo.gate("--no-api", "--format", "sarif")
    assert code == 1
    run = valid_sarif(sarif_schema, out)["runs"][0]
    rules = {r["id"]: r for r in run["tool"]["driver"]["rules"]}
    assert rules["static.dependencies/alpha"]["shortDescription"]["text"] == (
        "alpha depends on nothing."
    )
    assert rules["static.dependencies/beta"]["shortDescription"]["text"] == (
        "beta depends on alpha only."
    )
    assert "static.dependencies" not in rules
    (result,) = run["results"]
    assert result["ruleId"] == "static.dependencies/alpha"


def test_two_violations_on_one_line_stay_two_results(
    repo: Repo, sarif_schema: Draft4Validator
) -> None:
    repo.replace(
        "packages/alpha/src/ngx/alpha_mod.py",
        '        raise ValueError("empty")',
        '        raise ValueError("empty")\n    x[0].to("cpu").float(); x[1].to("cpu")',
    )
    code, out, _ = repo.gate("--no-api", "--format", "sarif")
    assert code == 1
    results = valid_sarif(sarif_schema, out)["runs"][0]["results"]
    lines = [r["locations"][0]["physicalLocation"]["region"]["startLine"] for r in results]
    assert len(results) == 3 and len(set(lines)) == 1
    assert len({r["ruleId"] for r in results}) == 1


def _every_status() -> Result:
    """A synthetic result: every status, located and unlocated violations,
    exact duplicates, hostile text and two stages sharing a spec rule id."""
    result = Result(mode="pr", stages=["alpha"], base="b" * 40, merge_base="m" * 40)
    result.changed_paths = 3
    for stage in ("alpha", "beta"):
        result.add_spec_rule(SpecRule(stage, "static.x", "forbidden_name", f"{stage} text", "s", 2))
    twice = Violation("static.x", "a\r\n.py", 3, "same\x00 \ufffe", "alpha", "static")
    result.outcomes = [
        Outcome("alpha", "spec", KEPT, "valid"),
        Outcome("alpha", "static", BROKEN, "3 violations", [twice, twice, twice]),
        Outcome(
            "alpha",
            "invariants",
            BROKEN,
            "1 violation",
            [Violation("invariant.unclaimed", None, None, "x\x1b]0;t\x07", "alpha", "invariants")],
        ),
        Outcome("alpha", "device:mps", NOT_RUN, "no report for mps\x0c"),
        Outcome(
            "repo",
            "stages",
            BROKEN,
            "1",
            [Violation("unregistered.rule", "p", None, "m", "repo", "stages")],
        ),
    ]
    return result


def test_sarif_of_every_shape_is_valid(sarif_schema: Draft4Validator) -> None:
    run = valid_sarif(sarif_schema, sarif.render(_every_status()))["runs"][0]
    by_rule = {r["ruleId"] for r in run["results"]}
    assert by_rule == {"static.x/alpha", "invariant.unclaimed", "unregistered.rule"}
    unlocated = next(r for r in run["results"] if r["ruleId"] == "invariant.unclaimed")
    assert unlocated["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] == (
        "specs/alpha.toml"
    )


def test_junit_of_every_shape_is_valid(junit_schema: xmlschema.XMLSchema10) -> None:
    out = junit.render(_every_status())
    junit_schema.validate(out)
    doc = junit_schema.to_dict(out)
    alpha, _repo = doc["testsuite"]
    assert (alpha["@tests"], alpha["@failures"], alpha["@skipped"]) == ("4", "2", "1")
    (properties,) = alpha["properties"]
    props = {p["@name"]: p["@value"] for p in properties["property"]}
    assert props["contracts.summary"].startswith("BROKEN: 1 stage, 0 KEPT, 2 BROKEN")
    assert props["contracts.base"] == "b" * 40 and props["contracts.head"] == "working tree"
    assert "(no file): invariant.unclaimed: x\\x1b]0;t\\x07" in out


@pytest.mark.parametrize("hostile", [False, True])
def test_junit_of_a_pr_is_valid(
    repo: Repo, junit_schema: xmlschema.XMLSchema10, hostile: bool
) -> None:
    (broken if hostile else allowed)(repo)
    code, out, _ = repo.gate(*PR, "--format", "junit")
    assert code == (1 if hostile else 0)
    junit_schema.validate(out)


def test_junit_of_an_error_is_valid(repo: Repo, junit_schema: xmlschema.XMLSchema10) -> None:
    code, out, _ = repo.gate("--stage", "nope\x01", "--no-api", "--format", "junit")
    assert code == 2
    junit_schema.validate(out)


def test_the_old_junit_summary_attribute_is_what_the_xsd_rejects(
    junit_schema: xmlschema.XMLSchema10,
) -> None:
    """The consumer's verdict on the shape issue 9 reported, so this test can fail."""
    bad = (
        '<testsuites name="c" summary="KEPT">'
        '<testsuite name="a" tests="0" failures="0" errors="0"/></testsuites>'
    )
    assert not junit_schema.is_valid(bad)


def test_report_schema_is_valid_and_versioned() -> None:
    schema = json.loads(REPORT_SCHEMA.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    assert schema["$id"].endswith("/specs/report.schema.json")
    assert schema["$defs"]["schema_version"] == {
        "const": REPORT_SCHEMA_VERSION,
        "description": schema["$defs"]["schema_version"]["description"],
    }


def test_report_schema_rejects_what_it_should(repo: Repo) -> None:
    _, payload = repo.gate_json("--no-api")
    for broken_payload in (
        {k: v for k, v in payload.items() if k != "summary"},
        {**payload, "schema_version": REPORT_SCHEMA_VERSION + 1},
        {**payload, "extra": 1},
        {**payload, "ok": True, "violations": [{"rule": "x"}]},
    ):
        with pytest.raises(AssertionError, match=r"report\.schema\.json"):
            valid_report(json.dumps(broken_payload))
