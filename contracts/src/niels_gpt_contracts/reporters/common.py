"""Helpers shared by the reporters."""

from __future__ import annotations

import unicodedata

from niels_gpt_contracts.result import BROKEN, KEPT, NOT_RUN, STOPPED, Result, Violation

# Characters that change how a line reads rather than what it says: bidi
# embeddings, overrides and isolates ("Trojan Source"), and the marks.
# U+FFFE and U+FFFF are no characters at all (and XML 1.0 cannot hold them).
_ESCAPED = frozenset(
    "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\ufffe\uffff"
)
_SHORT = {"\t": "\\t", "\n": "\\n", "\r": "\\r"}


def _escape(c: str) -> str:
    if c in _SHORT:
        return _SHORT[c]
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def printable(text: str) -> str:
    """``text`` as one visible line: control characters (TAB, CR, LF as
    ``\\t``, ``\\r``, ``\\n``; the rest of C0 and C1, DEL as ``\\xNN``),
    line and paragraph separators, lone surrogates (undecodable bytes of a
    file name), bidi controls and the noncharacters U+FFFE/U+FFFF become
    escapes; everything else is kept as it is.

    Human-facing formats (text, GitHub, JUnit) pass untrusted text (file
    names, messages) through this, so a name can neither start a new log line
    nor restyle or reorder the one it is on.
    """
    if text.isprintable():  # the common case; every escaped character is unprintable
        return text
    return "".join(
        _escape(c) if unicodedata.category(c) in ("Cc", "Cs", "Zl", "Zp") or c in _ESCAPED else c
        for c in text
    )


def ordered(violations: list[Violation]) -> list[Violation]:
    """Breaches on changed lines first, then located ones, then the rest."""
    return sorted(
        violations,
        key=lambda v: (not v.changed, v.path is None, v.line is None, v.path or "", v.line or 0),
    )


def location(v: Violation) -> str:
    if v.path is None:
        return "(no file)"
    return f"{v.path}:{v.line}" if v.line is not None else v.path


def summary(result: Result) -> str:
    """The one summary line every format ends with."""
    stages = result.stages
    broken = [s for s in stages if result.stage_status(s) == BROKEN]
    if any(o.stage not in stages and o.status == BROKEN for o in result.outcomes):
        broken.append("repo")
    pending = [s for s in stages if result.stage_status(s) == NOT_RUN]
    kept = len(stages) - len([s for s in broken if s in stages]) - len(pending)
    n = len(result.violations)
    verdict = "KEPT" if result.ok else "BROKEN"
    text = f"{verdict}: {len(stages)} stage{'s' * (len(stages) != 1)}, {kept} {KEPT}, "
    text += f"{len(broken)} {BROKEN}"
    if broken:
        text += f" ({', '.join(broken)})"
    if pending:
        text += f", {len(pending)} pending ({', '.join(pending)})"
    text += f"; {n} violation{'s' * (n != 1)}"
    not_run = sorted(
        {
            o.check.split(":", 1)[1]
            for o in result.outcomes
            if o.status == NOT_RUN
            and o.check.startswith("device:")
            and not o.summary.startswith(STOPPED)  # the verdict stopped before the device
        }
    )
    if not_run:
        text += f"; not run on {', '.join(not_run)} (a skip is not a pass)"
    if any(o.summary.startswith(STOPPED) for o in result.outcomes):
        text += "; stopped at the first BROKEN row (--full runs the rest)"
    if result.mode == "pr":
        text += f"; base {result.base[:12] if result.base else '?'}, "
        text += f"head {result.head[:12] if result.head else 'working tree'}"
    return text
