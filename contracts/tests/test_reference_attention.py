"""Attention's float64 reference agrees with main on its reference calls and sees a wrong scale."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import refkit


def test_main_agrees(tmp_path: Path) -> None:
    got, want = refkit.answers("attention", 7, tmp_path)
    assert refkit.judged("attention", got, want) == []


def test_a_wrong_scale_differs(tmp_path: Path) -> None:
    path = "packages/attention/src/niels_gpt/model/attention/causal.py"
    edit = {path: lambda s: s.replace("scale = 1.0 / math.sqrt(D)", "scale = 1.01 / math.sqrt(D)")}
    got, want = refkit.answers("attention", 7, tmp_path, edits=edit)
    found = refkit.judged("attention", got, want)
    assert found and all(v.rule == "oracle.differs" for v in found), found


def test_a_reference_is_importable_as_its_module_is(tmp_path: Path) -> None:
    """The worker loads a reference under a stage module's dotted name; a driver's
    ``import niels_gpt.model.x as x`` must find it, in a process where nothing had
    imported ``niels_gpt.model`` yet (the parent package is imported and set)."""
    ref = tmp_path / "ref.py"
    ref.write_text("ANSWER = 42\n", encoding="utf-8")
    worker = Path(refkit.__file__).parents[1] / "src/niels_gpt_contracts/sandbox/_oracle_worker.py"
    script = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('w', {str(worker)!r})\n"
        "w = importlib.util.module_from_spec(spec); spec.loader.exec_module(w)\n"
        f"w._load('niels_gpt.model._a_reference', {str(ref)!r})\n"
        "import niels_gpt.model._a_reference as r\n"
        "print(r.ANSWER)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "42"
