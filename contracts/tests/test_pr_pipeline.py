"""``contracts pr`` as phases: cheapest first, each row printed when known, each
phase timed, and the verdict stopped at the first BROKEN row unless ``--full``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prkit import PrRepo, findings

from niels_gpt_contracts.errors import ConfigError
from niels_gpt_contracts.result import Outcome, Result
from niels_gpt_contracts.verdict import pipeline
from niels_gpt_contracts.verdict.pr import phases
from niels_gpt_contracts.verdict.state import PrRequest

MIXER = "packages/mixer/src/ngt/model/mixer.py"
PHASES = [
    "static", "environment", "api", "names", "protocol", "runtime:cpu", "oracle:cpu", "tests:cpu",
    "mutants", "weakened", "sandbox",
]  # fmt: skip


def _statuses(out: dict[str, object]) -> dict[str, str]:
    return {o["check"]: o["status"] for o in out["outcomes"]}  # type: ignore[attr-defined,index]


def _docstring(pr_repo: PrRepo) -> None:
    pr_repo.replace(MIXER, "def mix(", '"""Mixing."""\n\n\ndef mix(')


def _meta_edit(pr_repo: PrRepo) -> None:
    """An honest code change and a README edit: the README belongs to no stage."""
    _docstring(pr_repo)
    pr_repo.write("README.md", "# ngt, now with notes\n")
    pr_repo.pr("mixer")


def test_the_phases_run_cheapest_first_and_the_guard_always() -> None:
    found = phases(PrRequest(repo=Path(), base="main", head=None))
    assert [p.name for p in found] == PHASES
    assert [p.name for p in found if p.always] == ["sandbox"]


def test_a_broken_path_stops_the_verdict_before_any_of_the_prs_code_runs(
    pr_repo: PrRepo,
) -> None:
    _meta_edit(pr_repo)
    code, out, err = pr_repo.verdict()
    assert code == 1
    assert "README.md" in {path for _, path in findings(out)}
    statuses = _statuses(out)
    assert statuses["paths"] == "BROKEN"
    for check in ("api", "runtime:cpu", "tests:cpu", "device:cpu", "mutants"):
        assert statuses[check] == "NOT RUN", check
    stopped = [o["summary"] for o in out["outcomes"] if o["status"] == "NOT RUN"]
    assert all("first BROKEN row (paths)" in s and "--full" in s for s in stopped)
    # Nothing of the PR's code ran: no sandbox was made, so there is no guard row.
    assert "sandbox" not in statuses
    assert "sandbox interpreter" not in err
    assert [p["phase"] for p in out["phases"]] == ["static", "sandbox"]
    assert out["seconds"] >= out["phases"][0]["seconds"]


def test_full_runs_every_check_after_a_broken_one(pr_repo: PrRepo) -> None:
    _meta_edit(pr_repo)
    code, out, _ = pr_repo.verdict("--full")
    assert code == 1
    statuses = _statuses(out)
    assert statuses["paths"] == "BROKEN"
    for check in ("api", "tests:cpu", "device:cpu", "mutants", "sandbox"):
        assert statuses[check] == "KEPT", check
    assert [p["phase"] for p in out["phases"]] == PHASES
    assert out["seconds"] >= sum(p["seconds"] for p in out["phases"])


def test_rows_are_printed_as_they_are_known_and_each_phase_is_timed(pr_repo: PrRepo) -> None:
    _docstring(pr_repo)
    pr_repo.pr("mixer")
    code, text, err = pr_repo.run_pr()
    assert code == 0, err[-2000:]
    lines = err.splitlines()

    def at(part: str) -> int:
        return next(i for i, line in enumerate(lines) if part in line)

    # Streamed rows carry the seconds since the verdict began and come in order:
    # the static rows before the sandbox exists, the tests row before the mutants.
    assert at("KEPT     mixer  paths") < at("sandbox interpreter") < at("KEPT     mixer  api")
    assert at("KEPT     mixer  tests:cpu") < at("KEPT     mixer  mutants")
    assert lines[at("KEPT     mixer  paths")].startswith("[")
    report = text.splitlines()
    took = [line for line in report if line.startswith("time: ")]
    assert len(took) == 1, report
    assert all(f"{name} " in took[0] for name in PHASES) and "; total " in took[0]
    assert report[-1].startswith("KEPT: ")


def test_a_phase_that_raises_leaves_no_verdict() -> None:
    """A phase's ConfigError goes up to the CLI (exit 2), with no row judged around it."""

    def boom(_state: object) -> None:
        raise ConfigError("expected an environment, found none")

    result = Result(mode="pr", stages=["s"])
    shown: list[Outcome] = []
    phase = pipeline.Phase("x", ("x",), boom)
    with pytest.raises(ConfigError, match="found none"):
        pipeline.run([phase], None, result, "s", lambda o, _: shown.append(o), full=False)
    assert result.outcomes == [] and shown == []


def test_runtime_rules_are_split_over_the_cores_and_all_judged(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Each probe process gets some of the rules; every rule's result is judged."""
    from types import SimpleNamespace

    from niels_gpt_contracts.sandbox import runtime_probe
    from niels_gpt_contracts.verdict import pr

    rules = [
        SimpleNamespace(
            id=f"r{i}",
            rule_id=f"runtime.r{i}",
            line=i + 1,
            message="no fused kernel",
            runtime=True,
            params={"driver": f"specs/s/d.py:drive{i}", "ops": ["aten::bad"]},
        )
        for i in range(5)
    ]
    spec = SimpleNamespace(id="s", path="specs/s.toml")
    calls: list[list[str]] = []

    def fake(box: object, part: list[SimpleNamespace], **kw: object) -> runtime_probe.ProbeRun:
        calls.append([r.id for r in part])
        recorded = {
            runtime_probe.rule_key(r): runtime_probe.Recorded(  # type: ignore[arg-type]
                ("aten::bad",) if r.id in ("r1", "r4") else ("aten::mm",), (), 1, None
            )
            for r in part
        }
        return runtime_probe.ProbeRun("cpu", recorded)

    monkeypatch.setattr(runtime_probe, "run", fake)
    state = SimpleNamespace(
        usable={},
        plan=SimpleNamespace(rules=lambda: [(spec, r) for r in rules]),
        jobs=2,
        stage="s",
    )
    env = SimpleNamespace(box=object(), w=SimpleNamespace(drivers=tmp_path, head=tmp_path))
    [row] = list(pr.runtime_phase("cpu")(state, env))  # type: ignore[arg-type]
    assert sorted(calls) == [["r0", "r2", "r4"], ["r1", "r3"]]
    assert row.status == "BROKEN"
    # One bad rule in each process's share; a share left out would be "not checked".
    assert [(v.rule, v.message.split(" while")[0]) for v in row.violations] == [
        ("runtime.r1", "dispatched aten::bad"),
        ("runtime.r4", "dispatched aten::bad"),
    ]


def test_a_phase_listed_after_the_environment_is_given_it() -> None:
    """The environment phase makes an ``Environment``; the phases after it take it as an
    argument, and one run without it is a wrongly ordered list, not a verdict."""

    from types import SimpleNamespace

    from niels_gpt_contracts.verdict import pr

    def needs(v: object, env: object) -> Iterator[Outcome]:
        yield Outcome("s", "x", "KEPT", str(env))

    with pytest.raises(RuntimeError, match="needs runs before the environment phase"):
        pr.after_environment(needs)(SimpleNamespace(env=None))  # type: ignore[arg-type]
    [row] = list(pr.after_environment(needs)(SimpleNamespace(env="made")))  # type: ignore[arg-type]
    assert row.summary == "made"
