"""The sampling seam: kv_cache when installed, else a plain loop with the same contract."""

from __future__ import annotations

import sys
import types
from typing import Any

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt_experiments import sampling
from niels_gpt_experiments.sampling import filter_logits, generate, plain_generate, printable

_STAGE = "niels_gpt.model.kv_cache"


@pytest.fixture
def model(device: torch.device) -> GPT:
    torch.manual_seed(0)
    return GPT(ModelConfig(V=32, T=10, C=16, L=1, H=2, d_ff=16, dropout=0.0)).to(device).eval()


def test_greedy_is_the_argmax_loop_and_the_context_slides(model: GPT, device: torch.device) -> None:
    prompt = torch.tensor([[1, 2, 3], [4, 5, 6]], device=device)
    out = plain_generate(model, prompt, 12, temperature=0.0)  # 3 + 12 > T = 10: must slide
    assert out.shape == (2, 15) and out.dtype == torch.int64 and torch.equal(out[:, :3], prompt)
    ids = prompt
    for _ in range(12):
        nxt = model(ids[:, -10:])[:, -1].argmax(-1, keepdim=True)  # (B, 1)
        ids = torch.cat((ids, nxt), 1)
    assert torch.equal(out, ids)


def test_seeded_sampling_repeats(model: GPT, device: torch.device) -> None:
    prompt = torch.tensor([[7]], device=device)

    def draw(seed: int) -> torch.Tensor:
        gen = torch.Generator(device=device).manual_seed(seed)
        return plain_generate(model, prompt, 8, temperature=1.5, generator=gen)

    assert torch.equal(draw(1), draw(1))
    assert not all(torch.equal(draw(1), draw(s)) for s in range(2, 6))


def _reference_filter(row: list[float], k: int | None, p: float | None) -> set[int]:
    keep = set(range(len(row)))
    if k is not None:
        keep = set(sorted(keep, key=lambda i: -row[i])[:k])
    if p is not None:
        live = sorted(keep, key=lambda i: -row[i])
        probs = torch.softmax(torch.tensor([row[i] for i in live], dtype=torch.float64), 0)
        total, chosen = 0.0, set()
        for i, prob in zip(live, probs.tolist(), strict=True):
            chosen.add(i)
            total += prob
            if total >= p:
                break
        keep = chosen
    return keep


@given(
    logits=st.lists(
        st.lists(st.floats(-5, 5), min_size=6, max_size=6, unique=True), min_size=1, max_size=3
    ),
    k=st.one_of(st.none(), st.integers(1, 6)),
    p=st.one_of(st.none(), st.floats(0.05, 0.95)),
)
def test_top_k_and_top_p_keep_exactly_the_reference_set(
    logits: list[list[float]], k: int | None, p: float | None
) -> None:
    out = filter_logits(torch.tensor(logits, dtype=torch.float64), k, p)
    for row, got in zip(logits, out, strict=True):
        kept = {i for i, v in enumerate(got.tolist()) if v != float("-inf")}
        assert kept == _reference_filter(row, k, p)


def test_the_seam_uses_the_kv_cache_stage_when_installed(
    model: GPT, device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    def fake_generate(m: GPT, ids: torch.Tensor, n: int, **kw: Any) -> torch.Tensor:
        calls.append({"model": m, "n": n, **kw, "training": m.training})
        return ids

    stage = types.ModuleType(_STAGE)
    stage.generate = fake_generate  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, _STAGE, stage)
    model.train()
    prompt = torch.tensor([[1]], device=device)
    generate(model, prompt, 3, temperature=0.5, top_k=4)
    assert calls == [{"model": model, "n": 3, "temperature": 0.5, "top_k": 4, "top_p": None,
                      "generator": None, "training": False}]  # fmt: skip
    assert model.training  # the caller's mode is restored
    out = generate(model, prompt, 3, temperature=0.0, allow_cache=False)
    assert len(calls) == 1 and out.shape == (1, 4)  # sharded models take the plain loop


def test_the_seam_falls_back_to_the_plain_loop(
    model: GPT, device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, _STAGE, None)  # importing it now raises ImportError
    assert sampling._cached_generate() is None
    prompt = torch.tensor([[3, 1]], device=device)
    assert torch.equal(
        generate(model, prompt, 5, temperature=0.0),
        plain_generate(model, prompt, 5, temperature=0.0),
    )


def test_printable_escapes_everything_that_could_drive_a_terminal() -> None:
    raw = b"ok\n\tline\x1b[31mred\x07\x00" + "é".encode() + b"\xff\\"
    text = printable(raw)
    assert text == "ok\n\tline\\x1b[31mred\\x07\\x00é\\xff\\"
    assert all(ch in "\n\t" or ch.isprintable() for ch in text)


def test_bad_generation_arguments_are_rejected(model: GPT, device: torch.device) -> None:
    with pytest.raises(ValueError, match=r"must be >= 0, got -1\.0, 2"):
        plain_generate(model, torch.tensor([[1]], device=device), 2, temperature=-1.0)
