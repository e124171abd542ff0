"""niels-ablate: equal sizes, the table's statistics, and a quick study end to end."""

from __future__ import annotations

import dataclasses
import json
import statistics
from pathlib import Path

import pytest

from niels_gpt_experiments.ablate import STUDY, main
from niels_gpt_experiments.config import TrainConfig
from niels_gpt_experiments.models import count_params
from niels_gpt_experiments.report import markdown_table, mean_std, summarise


@pytest.mark.parametrize(
    "settings",
    [TrainConfig(), TrainConfig(**{k: v for k, v in STUDY.items() if k in "TCLH"})],
    ids=["train-default", "ablation-study"],
)
def test_the_experiment_sizes_match_to_a_thousandth(settings: TrainConfig) -> None:
    v1 = dataclasses.replace(settings, model="v1").model_config()
    v0 = dataclasses.replace(settings, model="v0").model_config()
    p1, p0 = count_params("v1", v1), count_params("v0", v0)
    assert v0.d_ff != v1.d_ff and abs(p0 - p1) / p1 < 1e-3, (p0, p1)


def _run(model: str, seed: int, loss: float, tps: float) -> dict[str, object]:
    return {"model": model, "seed": seed, "params": 100, "final_val_loss": loss,
            "tokens_per_s": tps, "peak_bytes": 2**20 * (seed + 1)}  # fmt: skip


def test_summary_is_mean_and_sample_std_per_model() -> None:
    runs = [_run("v0", 0, 2.0, 10.0), _run("v0", 1, 3.0, 30.0), _run("v1", 0, 1.5, 20.0)]
    rows = {r["model"]: r for r in summarise(runs)}
    assert rows["v0"]["val_loss"] == (2.5, statistics.stdev([2.0, 3.0]))
    assert rows["v0"]["tokens_per_s"] == (20.0, statistics.stdev([10.0, 30.0]))
    assert rows["v0"]["peak_mib"] == (1.5, statistics.stdev([1.0, 2.0]))
    assert rows["v1"]["val_loss"] == (1.5, 0.0) and rows["v1"]["seeds"] == 1
    table = markdown_table(runs)
    assert "| v0 (LayerNorm + GELU) | 100 | 2.5000 ± 0.7071 | 20 ± 14 | 1.5 ± 0.7 |" in table
    assert mean_std([4.0]) == (4.0, 0.0)


def test_quick_study_end_to_end(corpus_dir: Path, data_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "ablate"
    code = main(["--quick", "--seeds", "2", "--corpus", str(corpus_dir),
                 "--data-dir", str(data_dir), "--out", str(out)])  # fmt: skip
    assert code == 0
    summary = json.loads((out / "ablation.json").read_text())
    runs = summary["runs"]
    assert sorted((r["model"], r["seed"]) for r in runs) == [
        ("v0", 0),
        ("v0", 1),
        ("v1", 0),
        ("v1", 1),
    ]
    for r in runs:
        assert r["tokens"] == runs[0]["tokens"]  # equal tokens for every run
        assert abs(r["params"] - runs[0]["params"]) / runs[0]["params"] < 1e-2
        assert r["peak_bytes"] > 0 and r["tokens_per_s"] > 0 and r["cpu_s"] > 0
        assert sorted(r["val_curve"], key=int)[-1] == str(r["tokens"] // r["tokens_per_step"])
    text = (out / "ablation.txt").read_text()
    assert "v0 (LayerNorm + GELU)" in text and "± " in text and summary["machine"] in text
    assert "CPU time of the runs" in text
    assert (out / "ablation.md").read_text().startswith("| model | params |")
    assert (out / "ablation.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bad_arguments_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--seeds", "0"])
    assert stop.value.code == 2 and "--seeds must be >= 1, got 0" in capsys.readouterr().err


def test_a_reused_out_is_refused_unless_overwrite(
    corpus_dir: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As niels-train does: a second study into the same --out replaced the first silently."""
    out = tmp_path / "ablate"
    (out / "v0-seed0").mkdir(parents=True)
    (out / "ablation.json").write_text("the first study")
    (out / "notes.txt").write_text("mine")
    flags = ["--quick", "--seeds", "1", "--corpus", str(corpus_dir), "--data-dir",
             str(data_dir), "--out", str(out)]  # fmt: skip
    with pytest.raises(SystemExit) as stop:
        main(flags)
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"error: --out {out} already holds a study (ablation.json, v0-seed0)" in err
    assert "--overwrite" in err and (out / "ablation.json").read_text() == "the first study"
    assert main([*flags, "--overwrite"]) == 0
    assert json.loads((out / "ablation.json").read_text())["runs"]
    assert (out / "notes.txt").read_text() == "mine"  # only the study's own files went


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--steps", "0"], "--steps 0: steps must be a positive int, got 0"),
        (["--device", "tpu"], "--device tpu: "),
        (["--timeout", "0"], "--timeout must be > 0 seconds, got 0.0"),
        (
            ["--data-dir", "/dev/null/cache"],
            "--data-dir /dev/null/cache: /dev/null is not a folder",
        ),
    ],
)
def test_input_errors_exit_2_naming_the_flag(
    flags: list[str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--quick", "--out", str(tmp_path / "o"), *flags])
    assert stop.value.code == 2 and f"niels-ablate: error: {named}" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()  # refused before anything ran


def test_a_missing_corpus_exits_2_before_any_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was exit 1 after a run's process failed, its reason in that run's log."""
    missing = tmp_path / "missing"
    with pytest.raises(SystemExit) as stop:
        main(["--quick", "--corpus", str(missing), "--out", str(tmp_path / "o")])
    assert stop.value.code == 2
    assert f"error: --corpus {missing}: corpus path" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
