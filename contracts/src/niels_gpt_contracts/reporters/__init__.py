"""Reporters: one ``Result`` rendered as text, JSON, JUnit XML, SARIF 2.1.0 or
GitHub workflow commands. Each module has ``render(result)`` and
``render_error(message)`` (for runs that stopped on a usage or config error).
"""

from __future__ import annotations

from collections.abc import Callable
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
