"""niels-train on one process: a run, its outputs, resume, accumulation, the CLI."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from niels_gpt_experiments import checkpoint
from niels_gpt_experiments import trainer as trainer_module
from niels_gpt_experiments.batches import Layout, train_offsets
from niels_gpt_experiments.cli import build_parser, config_from_args, train_main
from niels_gpt_experiments.config import QUICK, TrainConfig, check_same_run
from niels_gpt_experiments.corpus import CorpusSpec, open_corpus
from niels_gpt_experiments.models import build_model
from niels_gpt_experiments.progress import rate_text
from niels_gpt_experiments.trainer import TrainResult, accumulate_gradients, train

Tiny = Callable[..., TrainConfig]


def test_a_run_trains_evaluates_samples_and_checkpoints(
    tiny: Tiny, capsys: pytest.CaptureFixture[str]
) -> None:
    cfg = tiny(steps=8, eval_every=4, model="v0")
    result = train(cfg)
    assert sorted(result.losses) == list(range(1, 9)) and sorted(result.val_losses) == [4, 8]
    assert all(math.isfinite(v) for v in [*result.losses.values(), *result.val_losses.values()])
    assert result.val_losses[8] < result.val_losses[4] < math.log(256)  # it learns
    out = capsys.readouterr().out
    assert "step 4: val loss" in out and "--- greedy (step 8) ---" in out and "--- sampled" in out
    lines = [json.loads(line) for line in (cfg.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in lines if "loss" in r] == list(range(1, 9))
    assert [r["val_loss"] for r in lines if "val_loss" in r] == [
        result.val_losses[4],
        result.val_losses[8],
    ]
    run = json.loads((cfg.out_dir / "run.json").read_text())
    assert (
        run["config"]["model"] == "v0" and run["corpus"]["python"] == result.corpus_meta["python"]
    )
    assert checkpoint.latest(cfg.out_dir) == cfg.out_dir / "checkpoints" / "step-0000008"
    kept = sorted(p.name for p in (cfg.out_dir / "checkpoints").glob("step-*"))
    assert kept == ["step-0000004", "step-0000008"]


def test_interrupted_and_resumed_equals_uninterrupted(tiny: Tiny, tmp_path: Path) -> None:
    # Dropout on, so the restored RNG state matters; accumulation on, so it is covered.
    settings = {"steps": 6, "dropout": 0.2, "grad_accum": 2, "eval_every": 2}
    whole = train(tiny(**settings, out_dir=tmp_path / "whole"), keep_state=True)
    part = tiny(**settings, out_dir=tmp_path / "part")
    first = train(dataclasses.replace(part, stop_after=3))
    assert sorted(first.losses) == [1, 2, 3]
    rest = train(dataclasses.replace(part, resume=True), keep_state=True)
    assert rest.first_step == 3 and sorted(rest.losses) == [4, 5, 6]
    # Same process, same kernels, same RNG streams: the curve continues bit for bit.
    assert {**first.losses, **rest.losses} == whole.losses
    assert rest.val_losses == {k: v for k, v in whole.val_losses.items() if k > 3}
    assert whole.final_state is not None and rest.final_state is not None
    for name, value in whole.final_state.items():
        torch.testing.assert_close(rest.final_state[name], value, rtol=0, atol=0)
    logged = [json.loads(x) for x in (part.out_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged if "loss" in r] == list(range(1, 7))


def test_resume_refuses_a_checkpoint_of_other_settings(tiny: Tiny) -> None:
    cfg = tiny(steps=4, stop_after=2)
    train(cfg)
    with pytest.raises(checkpoint.CheckpointError, match=r"changed: lr 0.003 -> 0.001"):
        train(dataclasses.replace(cfg, lr=1e-3, resume=True, stop_after=None))


def test_resume_without_a_checkpoint_starts_fresh(tiny: Tiny) -> None:
    result = train(tiny(steps=2, resume=True))
    assert result.first_step == 0 and sorted(result.losses) == [1, 2]


@pytest.mark.parametrize("accum", [2, 4])
def test_accumulated_gradients_equal_the_full_batch_gradient(
    accum: int,
    corpus_dir: Path,
    data_dir: Path,
    device: torch.device,
    tol: Callable[..., dict[str, float]],
) -> None:
    corpus = open_corpus(CorpusSpec(path=corpus_dir), data_dir)
    offsets = train_offsets(0, 5, 8, len(corpus.train), 16)
    grads = {}
    for a in (1, accum):
        torch.manual_seed(0)
        cfg = TrainConfig(T=16, C=16, L=2, H=2, dropout=0.0).model_config()
        model = build_model("v1", cfg).to(device=device, dtype=torch.float64)
        scaler = torch.amp.GradScaler(device.type, enabled=False)
        loss = accumulate_gradients(
            model,
            "single",
            corpus.train,
            offsets,
            Layout(8, accum=a),
            16,
            contextlib.nullcontext(),
            scaler,
        )
        grads[a] = (loss, {n: p.grad for n, p in model.named_parameters()})
    torch.testing.assert_close(grads[accum][0], grads[1][0], **tol(torch.float64))
    for name, g in grads[1][1].items():
        torch.testing.assert_close(grads[accum][1][name], g, **tol(torch.float64))


def test_quick_and_explicit_flags_compose() -> None:
    args = build_parser().parse_args(
        ["--quick", "--steps", "7", "--model", "v0", "--include", "*.txt"]
    )
    cfg = config_from_args(args)
    assert cfg.steps == 7 and cfg.model == "v0" and cfg.include == ("*.txt",)
    assert QUICK["C"] == cfg.C and QUICK["T"] == cfg.T and cfg.lr == TrainConfig().lr
    assert config_from_args(build_parser().parse_args(["--beta2", "0.99"])).betas == (0.9, 0.99)


def test_cli_quick_run(
    corpus_dir: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = train_main(
        ["--quick", "--steps", "4", "--eval-every", "2", "--corpus", str(corpus_dir),
         "--data-dir", str(data_dir), "--out", str(tmp_path / "cli"), "--device", "cpu"]
    )  # fmt: skip
    assert code == 0
    assert "done: step 4, val loss" in capsys.readouterr().out


def test_cli_rejects_bad_settings_with_the_value(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        train_main(["--batch-size", "0"])
    assert stop.value.code == 2
    assert "--batch-size 0: batch_size must be a positive int, got 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        train_main(["--fsdp", "--precision", "fp16"])
    assert "use --precision bf16" in capsys.readouterr().err


def test_cli_reports_a_missing_corpus_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An input error: exit 2 and the flag named (it was exit 1, without the flag)."""
    missing = tmp_path / "missing"
    code = train_main(["--quick", "--corpus", str(missing), "--out", str(tmp_path / "o")])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" in err
    assert err.startswith(f"niels-train: --corpus {missing}: ")
    (tmp_path / "empty").mkdir()
    assert train_main(["--quick", "--corpus", str(tmp_path / "empty")]) == 2
    assert capsys.readouterr().err.startswith(f"niels-train: --corpus {tmp_path / 'empty'}: ")


def test_an_out_or_data_dir_that_cannot_be_a_folder_is_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both were a FileExistsError or NotADirectoryError traceback, exit 1."""
    file = tmp_path / "a-file"
    file.write_text("")
    assert train_main(["--quick", "--device", "cpu", "--out", str(file)]) == 2
    assert (
        capsys.readouterr().err == f"niels-train: --out {file}: {file} exists and is not a folder\n"
    )
    code = train_main(["--quick", "--device", "cpu", "--data-dir", str(file / "cache"),
                       "--out", str(tmp_path / "o")])  # fmt: skip
    assert code == 2
    err = capsys.readouterr().err
    assert err == f"niels-train: --data-dir {file / 'cache'}: {file} is not a folder\n"
    assert not (tmp_path / "o").exists()


def test_a_model_size_error_names_the_flags_not_the_fields(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``--heads 3`` said only ``ModelConfig.C must be divisible by H``."""
    with pytest.raises(SystemExit) as stop:
        train_main(["--heads", "3"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "error: --width 256, --heads 3: ModelConfig.C must be divisible by H" in err
    with pytest.raises(SystemExit) as stop:
        train_main(["--quick", "--layers", "0"])
    assert stop.value.code == 2 and "error: --layers 0: " in capsys.readouterr().err


@pytest.mark.parametrize(("steps", "warmup"), [(1, 0), (5, 0), (50, 5), (100, 10), (2000, 100)])
def test_the_default_warmup_is_a_tenth_of_the_run_at_most_100(steps: int, warmup: int) -> None:
    cfg = config_from_args(build_parser().parse_args(["--steps", str(steps)]))
    assert cfg.warmup is None and cfg.warmup_steps == warmup
    assert config_from_args(build_parser().parse_args(["--warmup", "0"])).warmup_steps == 0


def test_a_warmup_longer_than_the_run_names_both_flags(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        train_main(["--steps", "50", "--warmup", "100"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert "--warmup must be in [0, --steps] = [0, 50], got 100" in err
    assert "min(100, steps // 10) = 5" in err


def test_resume_compares_the_warmup_the_run_used(tiny: Tiny) -> None:
    # A checkpoint from before the default changed saved warmup=100 at 2000 steps:
    # an unset warm-up now means the same 100 steps, so it is the same run.
    cfg = tiny(steps=2000, warmup=None)
    saved = {**cfg.as_json(), "warmup": 100}
    check_same_run(json.dumps(saved), cfg)
    with pytest.raises(checkpoint.CheckpointError, match=r"warmup 50 -> 100"):
        check_same_run(json.dumps({**saved, "warmup": 50}), cfg)


def test_help_shows_every_default(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    with pytest.raises(SystemExit):
        parser.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--steps STEPS optimizer steps (default: 2000)" in text
    assert "(default: min(100, steps // 10))" in text and "(default: 3*C)" in text
    valued = [a for a in parser._actions if a.nargs is None and a.option_strings[0] != "--include"]
    assert valued and all("(default: " in (a.help or "") for a in valued), [
        a.option_strings for a in valued if "(default: " not in (a.help or "")
    ]


@pytest.mark.parametrize("name", ["cuda", "tpu"])
def test_a_device_this_machine_lacks_is_one_line(
    name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if name == "cuda" and torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the absent-device message cannot be shown")
    code = train_main(["--quick", "--device", name, "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith(f"niels-train: --device {name}: ")
    assert not (tmp_path / "o").exists()


def test_a_second_run_into_the_same_out_is_refused_unless_asked(
    corpus_dir: Path, data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    base = ["--quick", "--corpus", str(corpus_dir), "--data-dir", str(data_dir), "--out",
            str(out), "--device", "cpu", "--no-progress", "--sample-tokens", "0"]  # fmt: skip
    assert train_main([*base, "--steps", "4", "--eval-every", "2"]) == 0
    before = (out / "run.json").read_text(), (out / "metrics.jsonl").read_text()
    capsys.readouterr()
    assert train_main([*base, "--steps", "2", "--eval-every", "2"]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1 and "already holds a run (run.json, metrics.jsonl, checkpoints)" in err
    )
    assert "--resume" in err and "--overwrite" in err
    assert ((out / "run.json").read_text(), (out / "metrics.jsonl").read_text()) == before
    (out / "notes.txt").write_text("mine")
    assert train_main([*base, "--steps", "2", "--eval-every", "2", "--overwrite"]) == 0
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-0000002"]
    assert (out / "notes.txt").read_text() == "mine"  # only the run's own files went
    assert train_main([*base, "--steps", "2", "--eval-every", "2", "--resume"]) == 0
    capsys.readouterr()
    # Resuming with another run-defining flag is an input error too: exit 2, the flag named.
    assert train_main([*base, "--steps", "3", "--eval-every", "2", "--resume"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("niels-train: --steps: ") and "2 -> 3" in err


def test_the_bar_the_closing_line_and_the_log_show_the_run_average(
    corpus_dir: Path,
    data_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("COLUMNS", "200")  # the whole bar on one line
    results: list[TrainResult] = []

    def keep(cfg: TrainConfig) -> TrainResult:
        results.append(train(cfg))
        return results[-1]

    monkeypatch.setattr(trainer_module, "train", keep)
    out = tmp_path / "run"
    start = time.perf_counter()
    code = train_main(
        ["--quick", "--steps", "6", "--eval-every", "3", "--corpus", str(corpus_dir),
         "--data-dir", str(data_dir), "--out", str(out), "--device", "cpu"]
    )  # fmt: skip
    wall = time.perf_counter() - start
    assert code == 0
    (result,) = results
    # The definition: this run's tokens over its wall time, evaluations and checkpoints in.
    tokens = 6 * result.config.tokens_per_step
    assert result.tokens_per_s == tokens / result.seconds
    assert sum(result.step_seconds) < result.seconds < wall
    text = capsys.readouterr().out
    # Captured output is not a terminal: the progress shows as lines, the bar's columns.
    bar = re.findall(r"step 6/6 .*loss \S+ +([\d,]+ tokens/s)", text)
    closing = re.findall(
        r"done: step 6, val loss \S+, ([\d,]+ tokens/s) \(the run's average\)", text
    )
    assert bar and closing, text
    assert bar[-1] == closing[0] == rate_text(result.tokens_per_s)
    steps = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["tokens_per_s"] for r in steps if "loss" in r][-1] == result.tokens_per_s
