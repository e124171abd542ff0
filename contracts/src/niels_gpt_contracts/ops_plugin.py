"""pytest plugin for ``contracts pr``: the ATen ops a test's call dispatched (``--record-ops``).

``--record-ops=FILE`` names a JSON object ``{"patterns": [...], "tests":
[path prefixes]}``. The call phase of every test whose node id starts with
one of the prefixes runs under the torch profiler; the op names that match
one of the fnmatch patterns are attached to the test's report as the user
property ``niels_gpt_ops`` (so they reach the controller under xdist too),
and the invariant report (``pytest_plugin``) records them per test. The gate
compares them with the same test on the base's code: an op the PR's code
dispatches and the base's does not is the PR's.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

PROPERTY = "niels_gpt_ops"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("niels_gpt").addoption(
        "--record-ops",
        action="store",
        default=None,
        metavar="FILE",
        help="record the ATen ops matching the patterns in FILE during the listed tests",
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, None]:
    path = item.config.getoption("--record-ops")
    request: dict[str, list[str]] = json.loads(Path(path).read_text()) if path else {}
    if not request or not item.nodeid.startswith(tuple(request.get("tests", []))):
        yield
        return
    import torch

    cpu = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=cpu) as prof:
        yield
    names = {e.name() for e in prof.profiler.kineto_results.events()}
    patterns = request.get("patterns", [])
    hits = sorted(n for n in names if any(fnmatch.fnmatchcase(n, p) for p in patterns))
    item.user_properties.append((PROPERTY, hits))
