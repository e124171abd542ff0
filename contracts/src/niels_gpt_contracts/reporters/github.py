"""GitHub Actions workflow commands: ``::error file=…,line=…::`` per
violation, breaches on changed lines first (GitHub shows only the first ten
annotations of a step), then the table as plain log lines, then a summary
annotation."""

from __future__ import annotations

from niels_gpt_contracts.reporters import text
from niels_gpt_contracts.reporters.common import ordered, summary
from niels_gpt_contracts.result import Result

SHOWN = 10


def _data(value: str) -> str:
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(value: str) -> str:
    return _data(value).replace(":", "%3A").replace(",", "%2C")


def render(result: Result) -> str:
    out: list[str] = []
    violations = ordered(result.violations)
    for v in violations:
        props = []
        if v.path is not None:
            props.append(f"file={_prop(v.path)}")
            if v.line is not None:
                props.append(f"line={v.line}")
        props.append(f"title={_prop(f'{v.rule} ({v.stage})')}")
        out.append(f"::error {','.join(props)}::{_data(v.message)}")
    out.append(text.render(result).rstrip("\n"))
    line = summary(result)
    if violations and len(violations) > SHOWN:
        line += f" (GitHub annotates the first {SHOWN}; all are listed in the log above)"
    kind = "notice" if result.ok else "error"
    out.append(f"::{kind} title=contracts::{_data(line)}")
    return "\n".join(out) + "\n"


def render_error(message: str) -> str:
    return f"::error title=contracts configuration error::{_data(message)}\n"
