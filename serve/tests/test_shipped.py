"""The demo model shipped in the package (issue 48): ``niels-serve`` serves at once.

``shipped.export`` writes a run's weights as safetensors beside a JSON of what they are;
``load_shipped`` gives back the same model. The package's own files are checked for what
``demo.json`` promises: the preset's command, a validation loss, a few MB.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import torch

import niels_gpt_experiments.cli
from niels_gpt_experiments.loading import load_run
from niels_gpt_serve.demo import DEMO_FLAGS
from niels_gpt_serve.runs import ServeError, train_demo
from niels_gpt_serve.shipped import SHIPPED_NAME, export, load_shipped, shipped_dir

from .conftest import TINY_FLAGS, script, write_corpus


def test_an_exported_run_loads_as_the_same_model(tiny_run: Path, tmp_path: Path) -> None:
    meta_path = export(tiny_run, tmp_path, "niels-train --the-flags", "this machine")
    meta = json.loads(meta_path.read_text())
    assert meta["command"] == "niels-train --the-flags" and meta["trained"] == "this machine"
    assert meta["step"] == 30 == meta["val_step"] and meta["val_loss"] > 0
    shipped = load_shipped(folder=tmp_path)
    run = load_run(tiny_run)
    ids = torch.tensor([list(b"def value(self):\n")])  # (1, t)
    with torch.no_grad():
        assert torch.equal(shipped.model(ids), run.model(ids))
    assert shipped.config == run.config and shipped.training.val_loss == meta["val_loss"]
    assert shipped.model.lm_head.weight is shipped.model.tok_emb.weight  # tied, as trained


def test_a_damaged_shipped_model_is_refused_by_name(tiny_run: Path, tmp_path: Path) -> None:
    export(tiny_run, tmp_path, "c", "m")
    meta = json.loads((tmp_path / "demo.json").read_text())
    (tmp_path / "demo.json").write_text(json.dumps({**meta, "format": 9}))
    with pytest.raises(ValueError, match="expected format 1 and arch v1, got format 9"):
        load_shipped(folder=tmp_path)
    (tmp_path / "demo.json").write_text(json.dumps({**meta, "model_config": {
        **meta["model_config"], "C": 64}}))  # fmt: skip
    with pytest.raises(Exception, match=r"size|shape"):
        load_shipped(folder=tmp_path)


def test_the_package_ships_a_trained_demo_model() -> None:
    weights = shipped_dir() / f"{SHIPPED_NAME}.safetensors"
    assert weights.is_file() and weights.stat().st_size < 5 * 2**20
    meta = json.loads((shipped_dir() / f"{SHIPPED_NAME}.json").read_text())
    assert meta["command"].startswith("niels-train " + " ".join(DEMO_FLAGS))
    assert meta["step"] == meta["steps"] == meta["val_step"] == 600
    assert meta["val_loss"] < 2.5  # not "barely trained" (trained.BARELY_TRAINED_LOSS)
    assert "load average" in meta["trained"]
    shipped = load_shipped()
    assert shipped.training.summary().startswith("Trained for 600 steps")


def test_a_bare_first_start_serves_the_shipped_model_at_once(tmp_path: Path) -> None:
    """It trained for hours first (3.7 h projected on a busy 2-core machine)."""
    log = tmp_path / "serve.log"
    start = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.Popen(
            [script("niels-serve"), "--runs", str(tmp_path / "runs"), "--port", "0"],
            stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp_path,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )  # fmt: skip
    try:
        while not (found := re.search(r"open (http://127\.0\.0\.1:\d+)/", log.read_text())):
            assert proc.poll() is None and time.monotonic() - start < 120, log.read_text()
            time.sleep(0.05)
        page = httpx.get(f"{found.group(1)}/", timeout=30)
        model = httpx.get(f"{found.group(1)}/api/model", timeout=30).json()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    assert page.status_code == 200 and model["run"] == "demo" and model["step"] == 600
    assert "shipped demo model" in log.read_text() and "training" not in log.read_text()
    assert not (tmp_path / "runs").exists()  # nothing trained, nothing written


@pytest.mark.parametrize("how", ["status", "raise"])
def test_ctrl_c_in_the_demo_training_says_one_line_with_the_checkpoint_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    """niels-train stops on Ctrl+C with exit status 130 after saving (``status``); a
    Ctrl+C outside its steps reaches serve as ``KeyboardInterrupt`` (``raise``)."""
    corpus = write_corpus(tmp_path / "corpus")
    real = niels_gpt_experiments.cli.train_main

    def interrupted(argv: list[str]) -> int:
        tiny = [*TINY_FLAGS, "--corpus", str(corpus), "--data-dir", str(tmp_path)]
        real([*argv, *tiny, "--stop-after", "10", "--checkpoint-every", "10"])
        if how == "raise":
            raise KeyboardInterrupt
        return niels_gpt_experiments.cli.INTERRUPTED

    monkeypatch.setattr(niels_gpt_experiments.cli, "train_main", interrupted)
    with pytest.raises(ServeError) as stopped:
        train_demo(tmp_path / "runs", lambda line: None)
    kept = tmp_path / "runs" / "demo" / "checkpoints" / "step-0000010"
    assert str(stopped.value) == (
        f"the demo training stopped (Ctrl+C): its last checkpoint, {kept}, is kept; "
        "niels-serve --demo resumes it"
    )
