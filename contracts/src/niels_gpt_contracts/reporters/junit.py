"""JUnit XML: a test suite per stage, a test case per check; BROKEN is a
failure, NOT RUN is a skip (never a pass)."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from niels_gpt_contracts.reporters.common import location, ordered, summary
from niels_gpt_contracts.result import BROKEN, NOT_RUN, Result


def _clean(text: str) -> str:
    return "".join(
        c if c in "\t\n\r" or ord(c) >= 0x20 else "\ufffd"
        for c in text.encode("utf-8", "backslashreplace").decode("utf-8")
    )


def render(result: Result) -> str:
    root = ET.Element("testsuites", name="contracts")
    for stage in dict.fromkeys(o.stage for o in result.outcomes):
        rows = [o for o in result.outcomes if o.stage == stage]
        suite = ET.SubElement(
            root,
            "testsuite",
            name=stage,
            tests=str(len(rows)),
            failures=str(sum(o.status == BROKEN for o in rows)),
            skipped=str(sum(o.status == NOT_RUN for o in rows)),
            errors="0",
        )
        for o in rows:
            case = ET.SubElement(suite, "testcase", classname=f"contracts.{stage}", name=o.check)
            if o.status == BROKEN:
                failure = ET.SubElement(case, "failure", message=_clean(o.summary), type="BROKEN")
                failure.text = _clean(
                    "\n".join(
                        f"{location(v)}: {v.rule}: {v.message}" for v in ordered(o.violations)
                    )
                )
            elif o.status == NOT_RUN:
                ET.SubElement(case, "skipped", message=_clean(o.summary))
    root.set("summary", _clean(summary(result)))
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def render_error(message: str) -> str:
    root = ET.Element("testsuites", name="contracts")
    suite = ET.SubElement(root, "testsuite", name="contracts", tests="1", failures="0", errors="1")
    case = ET.SubElement(suite, "testcase", classname="contracts", name="configuration")
    ET.SubElement(case, "error", message=_clean(message), type="ConfigError")
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"
