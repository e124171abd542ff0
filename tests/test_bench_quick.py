"""``nox -s bench -- --quick``: writes nothing tracked unless asked, and its figures are sane.

The measuring (``benchmarks.run.collect``) is replaced by the result of a
real ``--quick`` run on the shared 2-core CPU (``data/bench-quick.json``), so
these tests exercise what the bench does with its figures (the table, the
sanity check, the files) in seconds.
"""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch
from benchmarks import decode, experiments, report, rope_autocast, run
from benchmarks import train as bench_train
from benchmarks.timing import Stat

from niels_gpt.config import ModelConfig

ROOT = Path(__file__).resolve().parents[1]
RECORDED = json.loads((Path(__file__).parent / "data" / "bench-quick.json").read_text())


def _tracked_state() -> tuple[str, dict[str, bytes]]:
    """``git status`` of the repository and the bytes of what a write would touch."""
    status = subprocess.run(
        ["git", "status", "--porcelain", "--untracked-files=all"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    watched = [ROOT / "README.md", *sorted((ROOT / "benchmarks" / "results").iterdir())]
    return status, {str(p): p.read_bytes() for p in watched}


@pytest.fixture
def recorded(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    res: dict[str, Any] = copy.deepcopy(RECORDED)
    monkeypatch.setattr(run, "collect", lambda device, quick, compile: copy.deepcopy(res))
    return res


def test_a_quick_run_writes_nothing_tracked(
    recorded: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    before = _tracked_state()
    assert run.main(["--quick"]) == 0
    assert _tracked_state() == before
    out = capsys.readouterr()
    assert "--quick: a smoke run" in out.out and "load average 5.8 at the start" in out.out
    assert "Sanity: every MFU at or below 100%" in out.out and "wrote" not in out.err


def test_out_writes_there_and_write_also_updates_the_readme(
    recorded: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = _tracked_state()
    assert run.main(["--quick", "--out", str(tmp_path / "a")]) == 0
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == [
        "bench.json", "bench.txt", "tokens_per_s.png"
    ]  # fmt: skip
    assert _tracked_state() == before  # --out names the folder: still nothing tracked
    copy_root = tmp_path / "root"
    copy_root.mkdir()
    (copy_root / "README.md").write_text("# x\n\n<!-- bench:start -->\nold\n<!-- bench:end -->\n")
    monkeypatch.setattr(report, "ROOT", copy_root)
    assert run.main(["--quick", "--write", "--out", str(tmp_path / "b")]) == 0
    readme = (copy_root / "README.md").read_text()
    assert "old" not in readme and "Latest `nox -s bench -- --write`" in readme
    assert (tmp_path / "b" / "bench.txt").read_text() in readme


def test_an_mfu_above_100_percent_is_flagged(recorded: dict[str, Any]) -> None:
    assert report.suspect_figures(recorded) == []
    row = recorded["experiments"]["models"]["rows"]["v1 bf16"]
    row["mfu"] = 1.532
    text = report.table(recorded)
    assert "Sanity: SUSPECT FIGURES" in text
    assert "[BUG?] downstream v1 bf16: MFU 153.2% > 100%: its peak or its FLOP count" in text


def test_bf16_rows_are_measured_against_the_bfloat16_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """The downstream section once divided bf16 steps by the float32 peak (MFU 150-210%)."""
    tiny = ModelConfig(V=16, T=8, C=8, L=1, H=2, d_ff=8, dropout=0.0)
    monkeypatch.setitem(bench_train.CONFIGS, "small", (tiny, 2))
    seconds = {"matmul": 1.0, "matmul bf16": 0.25, "matmul bf16 linear": 0.5}

    def fake_measure(fns: dict[str, Any], device: torch.device, **_: Any) -> dict[str, Stat]:
        return {n: Stat(seconds.get(n, 0.01), [seconds.get(n, 0.01)]) for n in fns}

    monkeypatch.setattr(experiments, "measure", fake_measure)
    out = experiments.bench_models(torch.device("cpu"), 1)
    n = 1024
    fp32, bf16 = 2.0 * n**3 / 1.0, 2.0 * n**3 / 0.25
    assert out["matmul_peak_flops"] == fp32 and out["matmul_bf16_peak_flops"] == bf16
    for name, row in out["rows"].items():
        peak = bf16 if name.endswith("bf16") else fp32
        assert row["matmul_peak_flops"] == peak, name
        assert row["mfu"] == pytest.approx(row["flops_per_step"] / 0.01 / peak), name
    assert len(out["rows"]) == 6 and not out["errors"]


@pytest.mark.parametrize(("load", "caveat"), [([0.5, 1.3], False), ([0.5, 2.5], True)])
def test_the_load_caveat_only_when_the_load_passed_the_cores(
    recorded: dict[str, Any], load: list[float], caveat: bool
) -> None:
    text = report.table({**recorded, "load_average": load, "cores": 2})
    assert f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end" in text
    assert ("(above the 2 cores: other work shared the machine" in text) is caveat


def _measured_sections(monkeypatch: pytest.MonkeyPatch, stop_at: str | None) -> None:
    """``collect``'s measurements replaced by the recorded run's figures; the section
    ``stop_at`` is interrupted (Ctrl+C, or a run killed while it measures)."""

    def gives(key: str) -> Any:
        def measured(*args: object, **kwargs: object) -> Any:
            if key == stop_at:
                raise KeyboardInterrupt
            return copy.deepcopy(RECORDED[key])

        return measured

    monkeypatch.setattr(run, "matmul_peak", gives("matmul_peak_flops"))
    monkeypatch.setattr(run, "bench_rope", gives("rope"))
    monkeypatch.setattr(rope_autocast, "bench", gives("rope_autocast"))
    monkeypatch.setattr(run, "bench_attention", gives("attention"))
    monkeypatch.setattr(run, "bench_train", gives("train"))
    monkeypatch.setattr(run, "bench_sweep", gives("sweep"))
    monkeypatch.setattr(decode, "bench", gives("decode"))
    monkeypatch.setattr(experiments, "bench", gives("experiments"))


def test_each_section_is_printed_as_it_ends_so_a_stopped_run_keeps_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 29: the table was printed only at the end, so a killed run left nothing."""
    _measured_sections(monkeypatch, stop_at="sweep")
    with pytest.raises(KeyboardInterrupt):
        run.main(["--quick"])
    out = capsys.readouterr().out
    for key in ("matmul_peak_flops", "rope", "rope_autocast", "attention", "train", "compile"):
        section = "\n".join(report.section_lines(RECORDED, key))
        assert section and section in out, key  # measured before the stop: kept
    assert "tokens/s against T" not in out and "Targets" not in out
    assert out.startswith("niels_gpt bench - ") and "--quick: a smoke run" in out

    _measured_sections(monkeypatch, stop_at=None)
    assert run.main(["--quick"]) == 0
    out = capsys.readouterr().out
    body = [line for key in report.SECTIONS for line in report.section_lines(RECORDED, key)]
    assert "\n".join(body) in out  # every section once, in the table's order
    assert out.count("RoPE forward") == 1
    assert out.rstrip("\n").endswith("\n".join(report.closing_lines(RECORDED)))
    assert "load average " in out and "wall time: " in out
