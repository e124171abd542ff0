"""GitHub Actions workflow commands: ``::error file=…,line=…::`` per
violation, breaches on changed lines first (GitHub shows only the first ten
annotations of a step), then the table as plain log lines, then a summary
annotation.

A PR author controls file names, messages and (in tree mode) spec text, and
must never be able to write a workflow command through them. The Actions
runner (actions/runner: ``ProcessInvoker`` reads stdout and stderr with
``StreamReader.ReadLine``, which ends a line at CR, LF or CRLF;
``ActionCommand.TryParseV2`` takes a line that starts with ``::name`` after
leading white space; ``ActionCommand.TryParse`` takes ``##[name`` anywhere in
a line; ``ActionCommandManager`` ignores every command but the resume token
after ``::stop-commands::<token>``) is kept out three ways:

- in an annotation, property values escape ``% CR LF : ,`` and the message
  escapes ``% CR LF``, exactly as the runner unescapes them;
- every plain line is ``inert``: printable (no CR, LF or other control), a
  ``##[`` shown as ``##\\x5b``, and a leading ``::`` as ``\\x3a:``;
- the table, besides, sits between ``::stop-commands::<token>`` and
  ``::<token>::``, with a fresh random token, as GitHub documents for
  untrusted output.

``InertLines`` applies ``inert`` to everything written to stderr in this
format (errors, tracebacks), which the runner reads the same way.
"""

from __future__ import annotations

import contextlib
import io
import re
import secrets
import sys
from collections.abc import Iterator
from typing import TextIO

from niels_gpt_contracts.reporters import text
from niels_gpt_contracts.reporters.common import ordered, printable, summary
from niels_gpt_contracts.result import Result

SHOWN = 10
_LEADING_COMMAND = re.compile(r"^(\s*):(?=:)")


def _unbracketed(value: str) -> str:
    return printable(value).replace("##[", "##\\x5b")


def _data(value: str) -> str:
    """A command's message: the runner unescapes ``%0D``, ``%0A``, ``%25``.

    Messages and titles are ``printable`` before this (``_unbracketed``); the
    ``file=`` property stays exact, as the runner needs it to find the file,
    and the runner consumes the command line rather than showing it.
    """
    return value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _prop(value: str) -> str:
    """A property value: the runner also unescapes ``%3A`` and ``%2C``."""
    return _data(value).replace(":", "%3A").replace(",", "%2C")


def inert(line: str) -> str:
    """``line`` as one log line the runner shows and never runs."""
    return _LEADING_COMMAND.sub(lambda m: m.group(1) + "\\x3a", _unbracketed(line))


def _stopped(lines: list[str]) -> list[str]:
    """``lines`` between stop-commands and its resume token."""
    token = secrets.token_hex(16)
    while any(token in line for line in lines):  # never, but cheap to be sure
        token = secrets.token_hex(16)
    return [f"::stop-commands::{token}", *lines, f"::{token}::"]


def render(result: Result) -> str:
    out: list[str] = []
    violations = ordered(result.violations)
    for v in violations:
        props = []
        if v.path is not None:
            props.append(f"file={_prop(v.path)}")  # exact: the runner unescapes it
            if v.line is not None:
                props.append(f"line={v.line}")
        props.append(f"title={_prop(_unbracketed(f'{v.rule} ({v.stage})'))}")
        out.append(f"::error {','.join(props)}::{_data(_unbracketed(v.message))}")
    out.extend(_stopped([inert(line) for line in text.lines(result)]))
    line = summary(result)
    if violations and len(violations) > SHOWN:
        line += f" (GitHub annotates the first {SHOWN}; all are listed in the log above)"
    kind = "notice" if result.ok else "error"
    out.append(f"::{kind} title=contracts::{_data(_unbracketed(line))}")
    return "\n".join(out) + "\n"


def render_error(message: str) -> str:
    return f"::error title=contracts configuration error::{_data(_unbracketed(message))}\n"


class InertLines(io.TextIOBase):
    """A text stream that passes each line to ``stream`` as ``inert(line)``.

    A line is written once its LF arrives; ``close`` writes an unfinished
    last line. The wrapped stream stays open.
    """

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._pending = ""

    def writable(self) -> bool:
        return True

    def write(self, s: str) -> int:
        *done, self._pending = (self._pending + s).split("\n")
        for line in done:
            self._stream.write(inert(line) + "\n")
        return len(s)

    def flush(self) -> None:
        self._stream.flush()

    def close(self) -> None:
        if self._pending:
            self._stream.write(inert(self._pending) + "\n")
            self._pending = ""
        self.flush()
        super().close()


@contextlib.contextmanager
def inert_stderr() -> Iterator[None]:
    """``sys.stderr`` written through ``InertLines`` inside the block."""
    guard = InertLines(sys.stderr)
    try:
        with contextlib.redirect_stderr(guard):
            yield
    finally:
        guard.close()
