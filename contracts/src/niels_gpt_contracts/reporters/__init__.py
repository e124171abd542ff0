"""Reporters: one ``Result`` rendered as text, JSON, JUnit XML, SARIF 2.1.0 or
GitHub workflow commands. Each module has ``render(result)`` and
``render_error(message)`` (for runs that stopped on a usage or config error).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import ModuleType

from niels_gpt_contracts.reporters import github, json_report, junit, sarif, text
from niels_gpt_contracts.result import Result

FORMATS: dict[str, ModuleType] = {
    "text": text,
    "json": json_report,
    "junit": junit,
    "sarif": sarif,
    "github": github,
}


def renderer(fmt: str) -> tuple[Callable[[Result], str], Callable[[str], str]]:
    module = FORMATS[fmt]
    return module.render, module.render_error


def stderr_guard(fmt: str) -> AbstractContextManager[None]:
    """What stderr must pass through while a run reports in ``fmt``.

    In the ``github`` format the Actions runner reads stderr for workflow
    commands as it reads stdout, so every line written there (errors,
    tracebacks, both carrying untrusted text) is made inert; other formats
    leave stderr as it is.
    """
    return github.inert_stderr() if fmt == "github" else contextlib.nullcontext()
