"""The device probe against fake devices: one whose first allocation fails, one
that hangs, one that computes wrongly, one that is absent, one that works.

The fake is a ``torch`` package put first on the probing process's PYTHONPATH:
pure Python, just the calls the probe makes, its behaviour chosen by the
``FAKE_TORCH`` environment variable. The real torch is used once, to check that
the probe and the pytest plugin's device check agree on this machine.
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
from pathlib import Path

import pytest

from niels_gpt_contracts import device_probe
from niels_gpt_contracts.device_probe import ProbeResult, probe

FAKE_TORCH = """
import math, os, random, time

__version__ = "0.0+fake"
MODE = os.environ.get("FAKE_TORCH", "ok")
if MODE == "crash":
    os._exit(9)
if MODE == "broken-import":
    raise ImportError("libtorch_cpu.so: cannot open shared object file")


class cuda:
    @staticmethod
    def is_available():
        return MODE != "absent"


class backends:
    class mps:
        @staticmethod
        def is_built():
            return MODE != "unbuilt"

        @staticmethod
        def is_available():
            return MODE != "absent"


class Generator:
    def manual_seed(self, seed):
        self.rng = random.Random(seed)
        return self


class Tensor:
    def __init__(self, rows, device="cpu"):
        self.rows, self.device = rows, device

    def to(self, device):
        if device != "cpu":
            if MODE == "oom":
                raise RuntimeError(
                    "MPS backend out of memory (MPS allocated: 0 bytes, other allocations: "
                    "0 bytes, max allowed: 7.93 GB). Tried to allocate 16.00 KB on private pool."
                )
            if MODE == "hang":
                time.sleep(600)
            if MODE == "hostile":
                raise RuntimeError("\\x1b[31mred\\x1b[0m " + "x" * 1000 + "\\nsecond line")
        return Tensor(self.rows, device)

    def cpu(self):
        return Tensor(self.rows, "cpu")

    def __truediv__(self, k):
        return Tensor([[v / k for v in r] for r in self.rows], self.device)

    def __sub__(self, other):
        return Tensor([[a - b for a, b in zip(r, s)] for r, s in zip(self.rows, other.rows)])

    def __matmul__(self, other):
        cols = list(zip(*other.rows))
        rows = [[sum(a * b for a, b in zip(r, c)) for c in cols] for r in self.rows]
        return Tensor(rows, self.device)

    def abs(self):
        return Tensor([[abs(v) for v in r] for r in self.rows], self.device)

    def max(self):
        return max(max(r) for r in self.rows)


def randn(n, m, generator):
    return Tensor([[generator.rng.gauss(0.0, 1.0) for _ in range(m)] for _ in range(n)])


def softmax(t, dim=-1):
    if MODE == "wrong" and t.device != "cpu":
        return Tensor([[1.0 / len(r)] * len(r) for r in t.rows], t.device)
    rows = []
    for r in t.rows:
        top = max(r)
        e = [math.exp(v - top) for v in r]
        rows.append([v / sum(e) for v in e])
    return Tensor(rows, t.device)
"""


@pytest.fixture
def fake_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """The fake torch first on the probing process's path; set FAKE_TORCH to pick a mode."""
    package = tmp_path / "fake" / "torch"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(FAKE_TORCH)
    monkeypatch.setenv("PYTHONPATH", str(package.parent))
    return monkeypatch


@pytest.mark.parametrize("kind", ["mps", "cuda"])
def test_first_allocation_failing_is_unusable(kind: str, fake_torch: pytest.MonkeyPatch) -> None:
    """The GitHub macOS runner case: the driver says yes, the first allocation says no."""
    fake_torch.setenv("FAKE_TORCH", "oom")
    result = probe(kind, timeout=60)
    assert result == ProbeResult(False, result.reason)
    assert result.reason.startswith("allocating on the device failed: RuntimeError: MPS backend")
    assert "max allowed: 7.93 GB" in result.reason


def test_hung_device_times_out(fake_torch: pytest.MonkeyPatch) -> None:
    fake_torch.setenv("FAKE_TORCH", "hang")
    started = time.monotonic()
    result = probe("mps", timeout=2.0)
    assert not result.ok
    assert result.reason == "mps probe gave no answer within 2 s (hung device?)"
    assert time.monotonic() - started < 30


def test_wrong_result_is_unusable(fake_torch: pytest.MonkeyPatch) -> None:
    fake_torch.setenv("FAKE_TORCH", "wrong")
    result = probe("cuda", timeout=60)
    assert not result.ok
    assert result.reason.startswith("matmul + softmax differ from the CPU by ")
    assert result.reason.endswith("(allowed 1e-3)")


@pytest.mark.parametrize(
    ("mode", "kind", "reason"),
    [
        ("absent", "mps", "torch 0.0+fake: torch.backends.mps.is_available() is False"),
        ("absent", "cuda", "torch 0.0+fake: torch.cuda.is_available() is False"),
        ("unbuilt", "mps", "torch 0.0+fake is built without MPS"),
        ("broken-import", "cuda", "cannot import torch: ImportError: libtorch_cpu.so: cannot"),
        ("crash", "mps", "mps probe died (exit status 9): no output"),
    ],
)
def test_absent_or_broken_torch_names_what_failed(
    mode: str, kind: str, reason: str, fake_torch: pytest.MonkeyPatch
) -> None:
    fake_torch.setenv("FAKE_TORCH", mode)
    result = probe(kind, timeout=60)
    assert not result.ok
    assert result.reason.startswith(reason), result.reason


def test_working_device_is_usable(fake_torch: pytest.MonkeyPatch) -> None:
    fake_torch.setenv("FAKE_TORCH", "ok")
    result = probe("mps", timeout=60)
    assert result.ok, result.reason
    assert result.reason.startswith("torch 0.0+fake: allocation, matmul + softmax agree")


def test_reason_is_one_printable_bounded_line(fake_torch: pytest.MonkeyPatch) -> None:
    """The probed process's words are untrusted: no escapes, no newlines, bounded."""
    fake_torch.setenv("FAKE_TORCH", "hostile")
    result = probe("mps", timeout=60)
    assert not result.ok
    assert result.reason.isprintable() and "\x1b" not in result.reason
    assert len(result.reason) <= 300 and result.reason.endswith("xxx...")
    assert "second line" not in result.reason


def test_missing_interpreter_and_bad_arguments() -> None:
    result = probe("cuda", python="/nonexistent/python3", timeout=5)
    assert not result.ok and result.reason.startswith("cannot run '/nonexistent/python3'")
    with pytest.raises(ValueError, match="one of cpu, mps, cuda, got 'tpu'"):
        probe("tpu")
    with pytest.raises(ValueError, match="timeout must be > 0"):
        probe("cpu", timeout=0)


def test_command_line(fake_torch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    fake_torch.setenv("FAKE_TORCH", "oom")
    assert device_probe.main(["mps", "--timeout", "60"]) == 1
    out = capsys.readouterr().out
    assert out.startswith("mps: unusable: allocating on the device failed") and out.count("\n") == 1
    fake_torch.setenv("FAKE_TORCH", "ok")
    assert device_probe.main(["cuda", "--python", sys.executable]) == 0
    assert capsys.readouterr().out.startswith("cuda: usable: torch 0.0+fake")
    with pytest.raises(SystemExit) as info:
        device_probe.main(["tpu"])
    assert info.value.code == 2


def test_agrees_with_the_pytest_plugin_on_this_machine() -> None:
    """Real torch: where the plugin's device check says no, the probe says no for
    that reason; the CPU, always there, is usable."""
    pytest.importorskip("torch")
    from niels_gpt_contracts.pytest_plugin import device_available

    with concurrent.futures.ThreadPoolExecutor() as pool:
        kinds = ("cpu", "mps", "cuda")
        results = dict(zip(kinds, pool.map(probe, kinds), strict=True))
    assert results["cpu"].ok, results["cpu"].reason
    for kind in ("mps", "cuda"):
        if not device_available(kind):
            assert not results[kind].ok
            assert "is_available() is False" in results[kind].reason or (
                "built without MPS" in results[kind].reason
            )
