"""Fixtures of the experiment's own tests: a small synthetic corpus and tiny runs.

These tests run against the installed wheels (``nox -s test-experiments``);
the device comes from the contracts plugin's ``--device`` option.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, settings

from niels_gpt_experiments.config import TrainConfig

settings.register_profile(
    "experiments",
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("experiments")

_WORDS = [
    *("def", "class", "return", "import", "from", "self", "value", "for", "while", "if"),
    *("else", "elif", "try", "except", "with", "as", "lambda", "yield", "None", "True"),
    *("False", "pass", "break", "continue", "print", "range", "len", "list", "dict", "tuple"),
]


def write_corpus(root: Path, files: int, lines: int, seed: int) -> Path:
    """A folder of Python-looking files, the same for the same arguments."""
    rng = random.Random(seed)
    for i in range(files):
        body = []
        for _ in range(lines):
            words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(2, 8)))
            body.append("    " * rng.randint(0, 2) + words + ("" if rng.random() < 0.7 else ":"))
        path = root / f"pkg{i % 3}" / f"mod_{i:02d}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("\n".join(body) + "\n")
    return root


@pytest.fixture(scope="session")
def corpus_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 40 KiB in 24 files: enough for validation to get files of its own."""
    return write_corpus(tmp_path_factory.mktemp("corpus"), files=24, lines=40, seed=7)


@pytest.fixture(scope="session")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("token-cache")


@pytest.fixture
def tiny(
    corpus_dir: Path, data_dir: Path, tmp_path: Path, device: torch.device
) -> Callable[..., TrainConfig]:
    """``tiny(**overrides)``: a seconds-long run on the synthetic corpus, on ``device``."""

    def make(**overrides: Any) -> TrainConfig:
        base = TrainConfig(
            T=16, C=16, L=2, H=2, steps=6, batch_size=4, warmup=2, lr=3e-3,
            eval_every=3, eval_batches=1, sample_tokens=4, progress=False,
            corpus=corpus_dir, data_dir=data_dir, out_dir=tmp_path / "run",
            device=device.type,
        )  # fmt: skip
        return dataclasses.replace(base, **overrides)

    return make


@pytest.fixture(scope="session")
def randomise() -> Callable[[torch.nn.Module, int], None]:
    """``randomise(module, seed)``: every parameter filled with non-trivial values
    (matrices N(0, 0.3), vectors 1 + N(0, 0.3)), so no norm or bias is a no-op."""

    def fill(module: torch.nn.Module, seed: int) -> None:
        gen = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in module.parameters():
                noise = torch.randn(p.shape, generator=gen, dtype=torch.float64) * 0.3
                p.copy_(noise + (1.0 if p.ndim == 1 else 0.0))  # (*p.shape)

    return fill


_TOLERANCES = {
    torch.float64: {"rtol": 1e-10, "atol": 1e-12},
    torch.float32: {"rtol": 1e-4, "atol": 1e-5},
}


@pytest.fixture(scope="session")
def tol() -> Callable[[torch.dtype], dict[str, float]]:
    """``tol(dtype)``: comparison tolerances against a reference in that dtype."""
    return _TOLERANCES.__getitem__
