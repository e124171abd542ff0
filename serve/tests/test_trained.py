"""How trained the served model is: read from its run folder, shown by /api/model."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from niels_gpt_serve.app import Served
from niels_gpt_serve.trained import BARELY_TRAINED_LOSS, Training, read_training

META = {"config": {"steps": 30}}


def write_metrics(run: Path, lines: list[object]) -> None:
    run.mkdir(parents=True, exist_ok=True)
    text = "".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    (run / "metrics.jsonl").write_text(text)


def evaluation(step: int, loss: float) -> str:
    return json.dumps({"step": step, "val_loss": loss, "tokens": step * 100}) + "\n"


def step_line(step: int) -> str:
    return json.dumps({"step": step, "loss": 9.0, "tokens": step * 100}) + "\n"


def test_the_served_step_gets_the_evaluation_at_it_or_the_last_before(tmp_path: Path) -> None:
    lines = [evaluation(10, 3.0), step_line(10), evaluation(20, 2.0), step_line(20),
             step_line(25), evaluation(30, 1.5), step_line(30)]  # fmt: skip
    write_metrics(tmp_path, lines)
    assert read_training(tmp_path, 20, META) == Training(20, 30, 2.0, 20, 2000)
    assert read_training(tmp_path, 25, META) == Training(25, 30, 2.0, 20, 2500)
    assert read_training(tmp_path, 30, META) == Training(30, 30, 1.5, 30, 3000)
    assert read_training(tmp_path, 5, META) == Training(5, 30, None, None, None)


def test_a_missing_or_damaged_log_gives_unknown_figures_never_an_error(tmp_path: Path) -> None:
    assert read_training(tmp_path, 7, {}) == Training(7)
    write_metrics(tmp_path, ['{"step": 7, "val_lo', "[1, 2]\n", '{"step": 7, "val_loss": NaN}\n',
                             '{"step": "7", "val_loss": 1.0}\n', evaluation(4, 2.25)])  # fmt: skip
    assert read_training(tmp_path, 7, {"config": "?"}) == Training(7, None, 2.25, 4, None)


def test_the_summary_says_plainly_how_trained_the_model_is() -> None:
    trained = Training(1000, 1000, 1.4567, 1000, 2_048_000)
    assert not trained.barely_trained
    assert trained.summary() == (
        "Trained for 1000 steps (2,048,000 tokens); validation loss 1.457 nats a byte "
        "(uniform guessing: 5.545)."
    )
    noise = Training(20, 20, BARELY_TRAINED_LOSS + 0.01, 20, None)
    assert noise.barely_trained and "This model is barely trained" in noise.summary()
    unknown = Training(3, 50)
    assert unknown.barely_trained
    assert unknown.summary().startswith("Trained for 3 of 50 steps; no validation loss recorded.")


def test_api_model_shows_the_checkpoint_s_own_figures(
    client: httpx.Client, served: Served, tiny_run: Path
) -> None:
    """The tiny run's metrics.jsonl, read here directly, is what /api/model reports."""
    records = [json.loads(line) for line in (tiny_run / "metrics.jsonl").read_text().splitlines()]
    val = next(r for r in records if r["step"] == served.step and "val_loss" in r)
    planned = json.loads((tiny_run / "run.json").read_text())["config"]["steps"]
    training = client.get("/api/model").json()["training"]
    assert training["val_loss"] == val["val_loss"] and training["val_step"] == served.step
    assert training["steps"] == planned and training["tokens"] == val["tokens"]
    assert training["barely_trained"] is (val["val_loss"] > BARELY_TRAINED_LOSS)
    assert f"validation loss {val['val_loss']:.3f} nats a byte" in training["summary"]
    assert training["summary"].startswith(f"Trained for {served.step} steps")
