"""pytest plugin: ``--device``, the ``device`` fixture, the ``invariant`` marker
and the per-invariant report the gate reads.

Tests never pick a device themselves: a nox ``test-<device>`` session passes
``--device``. Asking for a device this machine lacks is a usage error (the run
fails); the nox session decides beforehand whether to skip instead.

``--invariant-report=PATH`` writes, after the run, one JSON object::

    {"device": "cpu", "exitstatus": 0,
     "source": {"tree": "<sha256 of the stage sources and tests>",
                "selection": {"args": ["packages"], "narrowed_by": []}},
     "invariants": {"rope.norm_preserved":
        {"passed": 3, "failed": 0, "skipped": 0, "tests": ["packages/...::test_x"],
         "failed_tests": []}},
     "tests": {"packages/...::test_x": {"outcome": "passed", "invariants": [...],
                                         "reason": ""}},
     "collected": ["packages/...::test_x", ...]}

``source`` says what the run tested (``niels_gpt_contracts.fingerprint``) and
how the test selection was narrowed (``-k``, ``-m``, ``--deselect``, node ids,
``-x``...); the gate refuses a report from another tree or a narrowed one.
``tests`` has one outcome per test (``failed`` when any phase failed,
``skipped`` for a skip or an expected failure, else ``passed``); ``collected``
lists the collected test ids (filled when collection runs in this process,
that is without xdist workers).

It works under pytest-xdist: workers attach the claimed ids to each report as
a user property and the controller writes the file.
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from niels_gpt_contracts import device_report, fingerprint, specpath
from niels_gpt_contracts.collection import (
    COLLECTED,
    CollectionRecorder,
    covered_stages,
    selection,
)

if TYPE_CHECKING:
    import torch

DEVICES = ("cpu", "mps", "cuda")
_PROPERTY = "niels_gpt_invariants"
_OPS = "niels_gpt_ops"
_OUTCOMES = ("passed", "failed", "skipped")


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("niels_gpt", "niels_gpt device selection and invariant report")
    group.addoption(
        "--device",
        action="store",
        default="cpu",
        choices=DEVICES,
        help="device the model tests run on (default: cpu); an absent device is a usage error",
    )
    group.addoption(
        "--invariant-report",
        action="store",
        default=None,
        metavar="PATH",
        help="write per-invariant outcomes of this run as JSON to PATH",
    )
    group.addoption(
        "--invariant-report-merge",
        action="store_true",
        default=False,
        help="add this run's outcomes to the report already at --invariant-report, stage by "
        "stage, instead of replacing it (the test-<device> sessions pass it)",
    )
    group.addoption(
        "--invariant-prefix",
        action="append",
        default=[],
        metavar="PREFIX",
        help="run only tests claiming an invariant whose id starts with PREFIX "
        "(e.g. 'rope.'; repeatable); the mutant gate uses it",
    )


def device_available(name: str) -> bool:
    """Whether torch can use device type ``name`` here (cpu, mps or cuda)."""
    import torch

    if name == "cuda":
        return torch.cuda.is_available()
    if name == "mps":
        return torch.backends.mps.is_built() and torch.backends.mps.is_available()
    return name == "cpu"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "invariant(id): the test verifies spec invariant '<stage>.<id>' (see specs/)",
    )
    # the spec kit and the stages' test helpers, imported by name (``specpath``)
    sys.path.extend(p for p in specpath.test_path(config.rootpath) if p not in sys.path)
    name = config.getoption("--device")
    if name != "cpu" and not device_available(name):
        raise pytest.UsageError(f"--device {name}: {name} is not available on this machine")
    path = config.getoption("--invariant-report")
    if path:
        config.pluginmanager.register(CollectionRecorder(config), "niels_gpt_collection")
    if path and not hasattr(config, "workerinput"):
        tree = fingerprint.tree(config.rootpath)
        source: dict[str, object] = {
            "tree": str(tree),
            "stages": tree.stages,
            "selection": selection(config),
        }
        merge = bool(config.getoption("--invariant-report-merge"))
        report = InvariantReport(Path(path), name, source, tree.stages, merge)
        report.complete = covered_stages(config, tree.stages)
        config.pluginmanager.register(report, "niels_gpt_invariants")


def claimed_invariants(item: pytest.Item) -> list[str]:
    """The invariant ids an item claims through ``@pytest.mark.invariant``."""
    ids: list[str] = []
    for mark in item.iter_markers(name="invariant"):
        if len(mark.args) != 1 or not isinstance(mark.args[0], str) or mark.kwargs:
            raise pytest.UsageError(
                f"{item.nodeid}: @pytest.mark.invariant takes one string id, "
                f"got args={mark.args!r} kwargs={mark.kwargs!r}"
            )
        ids.append(mark.args[0])
    return ids


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    ids = claimed_invariants(item)
    if ids:
        item.user_properties.append((_PROPERTY, ids))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    prefixes = tuple(config.getoption("--invariant-prefix") or ())
    if not prefixes:
        return
    keep: list[pytest.Item] = []
    drop: list[pytest.Item] = []
    for item in items:
        claims = claimed_invariants(item)
        (keep if any(c.startswith(prefixes) for c in claims) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def _reason(report: pytest.TestReport) -> str:
    """A skip's reason, ``xfail: ...`` for an expected failure, else the crash line."""
    if hasattr(report, "wasxfail"):
        return f"xfail: {report.wasxfail}"
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2])
    crash = getattr(longrepr, "reprcrash", None)
    return str(getattr(crash, "message", "") or "")[:500]


class InvariantReport:
    """Collects outcomes per claimed invariant and per test on the controller; writes them."""

    def __init__(
        self,
        path: Path,
        device: str,
        source: dict[str, object],
        keys: dict[str, str] | None = None,
        merge: bool = False,
    ) -> None:
        self.path = path
        self.device = device
        self.source = source
        self.keys = keys or {}
        self.merge = merge
        self.complete: set[str] = set()
        self.recorder: CollectionRecorder | None = None
        self.every_collected: list[str] = []
        self.counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(_OUTCOMES, 0))
        self.tests: dict[str, set[str]] = defaultdict(set)
        self.failed_tests: dict[str, set[str]] = defaultdict(set)
        self.outcomes: dict[str, dict[str, object]] = {}
        self.collected: list[str] = []

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        self.collected = [item.nodeid for item in session.items]

    @staticmethod
    def _local_collection(session: pytest.Session) -> list[str]:
        recorder = session.config.pluginmanager.get_plugin("niels_gpt_collection")
        return recorder.collected if isinstance(recorder, CollectionRecorder) else []

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: object, error: object) -> None:
        """xdist: a worker's whole collection (they all collect the same tests)."""
        found = getattr(node, "workeroutput", {}).get(COLLECTED)
        if isinstance(found, list) and not self.every_collected:
            self.every_collected = [str(n) for n in found]

    def _record_test(self, report: pytest.TestReport, ids: list[str]) -> None:
        outcome = "skipped" if hasattr(report, "wasxfail") else report.outcome
        stage = fingerprint.owner(report.nodeid)
        entry = self.outcomes.setdefault(
            report.nodeid,
            {
                "outcome": "passed",
                "invariants": ids,
                "reason": "",
                "key": self.keys.get(stage, "") if stage else "",
            },
        )
        ops = next((v for k, v in report.user_properties if k == _OPS), None)
        if isinstance(ops, list):  # ops_plugin's --record-ops
            entry["ops"] = [str(o) for o in ops]
        if entry["outcome"] == "failed":
            return  # a failure in any phase stands
        if outcome == "failed" or (outcome == "skipped" and entry["outcome"] == "passed"):
            entry["outcome"], entry["reason"] = outcome, _reason(report)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        ids = next((v for k, v in report.user_properties if k == _PROPERTY), None)
        claimed = [str(i) for i in ids] if isinstance(ids, list) else []
        if report.when == "call" or report.outcome != "passed":
            self._record_test(report, claimed)
        if not claimed:
            return
        outcome = report.outcome
        # One outcome per test: a failure in any phase, the call phase otherwise,
        # and a skip raised in setup.
        if not (outcome == "failed" or report.when == "call" or outcome == "skipped"):
            return
        for inv in claimed:
            self.counts[inv][outcome] += 1
            self.tests[inv].add(report.nodeid)
            if outcome == "failed":
                self.failed_tests[inv].add(report.nodeid)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        payload = {
            "device": self.device,
            "exitstatus": int(session.exitstatus),
            "source": self.source,
            "invariants": {
                inv: {
                    **self.counts[inv],
                    "tests": sorted(self.tests[inv]),
                    "failed_tests": sorted(self.failed_tests[inv]),
                }
                for inv in sorted(self.counts)
            },
            "tests": dict(sorted(self.outcomes.items())),
            "collected": self.collected,
            "format": device_report.FORMAT,
            "sections": device_report.sections(
                self.every_collected or self._local_collection(session),
                self.keys,
                self.complete,
                int(session.exitstatus),
            ),
        }
        if self.merge:
            payload = device_report.merge(_read(self.path), payload)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(payload, indent=2) + "\n")


def _read(path: Path) -> object:
    """The report already at ``path``, or ``None`` (absent or unreadable: not merged)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


@pytest.fixture(scope="session")
def device(pytestconfig: pytest.Config) -> torch.device:
    """The ``torch.device`` this run targets (from ``--device``)."""
    import torch

    return torch.device(pytestconfig.getoption("--device"))


@pytest.fixture(scope="session")
def float_dtypes(device: torch.device) -> tuple[torch.dtype, ...]:
    """Floating dtypes the device supports: float32, plus float64 except on MPS."""
    import torch

    if device.type == "mps":
        return (torch.float32,)
    return (torch.float32, torch.float64)
