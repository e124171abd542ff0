"""JUnit XML, valid against the common ``junit-10.xsd`` (Jenkins xUnit): a
test suite per stage, a test case per check; BROKEN is a failure, NOT RUN a
skip (never a pass). The run's summary, verdict and revisions are
``<properties>`` of every suite (the schema allows no attribute for them on
``<testsuites>``). Untrusted text goes through ``printable``, which also
keeps out the characters XML 1.0 cannot hold."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from niels_gpt_contracts.reporters.common import location, ordered, printable, summary
from niels_gpt_contracts.result import BROKEN, NOT_RUN, Result


def _properties(suite: ET.Element, result: Result) -> None:
    props = ET.SubElement(suite, "properties")
    values = {
        "contracts.summary": summary(result),
        "contracts.verdict": "KEPT" if result.ok else "BROKEN",
        "contracts.mode": result.mode,
        "contracts.base": result.base,
        "contracts.head": result.head or ("working tree" if result.mode == "pr" else None),
        "contracts.merge_base": result.merge_base,
    }
    for name, value in values.items():
        if value is not None:
            ET.SubElement(props, "property", name=name, value=printable(value))


def render(result: Result) -> str:
    root = ET.Element("testsuites", name="contracts")
    totals = {"tests": 0, "failures": 0}
    for stage in dict.fromkeys(o.stage for o in result.outcomes):
        rows = [o for o in result.outcomes if o.stage == stage]
        failures = sum(o.status == BROKEN for o in rows)
        totals["tests"] += len(rows)
        totals["failures"] += failures
        suite = ET.SubElement(
            root,
            "testsuite",
            name=stage,
            tests=str(len(rows)),
            failures=str(failures),
            errors="0",
            skipped=str(sum(o.status == NOT_RUN for o in rows)),
        )
        _properties(suite, result)
        for o in rows:
            case = ET.SubElement(suite, "testcase", classname=f"contracts.{stage}", name=o.check)
            if o.status == BROKEN:
                failure = ET.SubElement(
                    case, "failure", message=printable(o.summary), type="BROKEN"
                )
                failure.text = "\n".join(
                    printable(f"{location(v)}: {v.rule}: {v.message}")
                    for v in ordered(o.violations)
                )
            elif o.status == NOT_RUN:
                ET.SubElement(case, "skipped", message=printable(o.summary))
    root.set("tests", str(totals["tests"]))
    root.set("failures", str(totals["failures"]))
    root.set("errors", "0")
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def render_error(message: str) -> str:
    root = ET.Element("testsuites", name="contracts", tests="1", failures="0", errors="1")
    suite = ET.SubElement(root, "testsuite", name="contracts", tests="1", failures="0", errors="1")
    case = ET.SubElement(suite, "testcase", classname="contracts", name="configuration")
    ET.SubElement(case, "error", message=printable(message), type="ConfigError")
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
