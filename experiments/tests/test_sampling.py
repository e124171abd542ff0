"""The sampling seam: the kv_cache stage, or for sharded models a plain loop over its filter."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from niels_gpt.config import ModelConfig
from niels_gpt.model import kv_cache
from niels_gpt.model.gpt import GPT
from niels_gpt_experiments.sampling import generate, plain_generate, printable


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


@pytest.mark.parametrize("knobs", [{"top_k": 1}, {"top_p": 1e-6}])
def test_the_plain_loop_filters_through_the_stage(
    model: GPT, device: torch.device, knobs: dict[str, Any]
) -> None:
    """top_k=1 or a vanishing top_p leaves one token a step: a hot sample is the argmax."""
    prompt = torch.tensor([[2, 9]], device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    hot = plain_generate(model, prompt, 6, temperature=5.0, generator=gen, **knobs)
    assert torch.equal(hot, plain_generate(model, prompt, 6, temperature=0.0))


def test_the_plain_loop_draws_from_the_stages_filter(
    model: GPT, device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[dict[str, Any]] = []
    real = kv_cache.filter_logits

    def spy(logits: torch.Tensor, **knobs: Any) -> torch.Tensor:
        seen.append({"shape": tuple(logits.shape), **knobs})
        return real(logits, **knobs)

    monkeypatch.setattr(kv_cache, "filter_logits", spy)
    plain_generate(model, torch.tensor([[1], [2]], device=device), 2, temperature=0.7, top_p=0.9)
    assert seen == [{"shape": (2, 32), "temperature": 0.7, "top_k": None, "top_p": 0.9}] * 2


def test_the_seam_uses_the_kv_cache_stage(
    model: GPT, device: torch.device, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[dict[str, Any]] = []

    def fake_generate(m: GPT, ids: torch.Tensor, n: int, **kw: Any) -> torch.Tensor:
        calls.append({"model": m, "n": n, **kw, "training": m.training})
        return ids

    monkeypatch.setattr(kv_cache, "generate", fake_generate)
    model.train()
    prompt = torch.tensor([[1]], device=device)
    generate(model, prompt, 3, temperature=0.5, top_k=4)
    assert calls == [{"model": model, "n": 3, "temperature": 0.5, "top_k": 4, "top_p": None,
                      "generator": None, "training": False}]  # fmt: skip
    assert model.training  # the caller's mode is restored
    out = generate(model, prompt, 3, temperature=0.0, allow_cache=False)
    assert len(calls) == 1 and out.shape == (1, 4)  # sharded models take the plain loop


def test_the_cached_and_plain_paths_agree_greedily(model: GPT, device: torch.device) -> None:
    prompt = torch.tensor([[3, 1]], device=device)
    assert torch.equal(
        generate(model, prompt, 5, temperature=0.0),
        generate(model, prompt, 5, temperature=0.0, allow_cache=False),
    )


def test_printable_escapes_everything_that_could_drive_a_terminal() -> None:
    raw = b"ok\n\tline\x1b[31mred\x07\x00" + "é".encode() + b"\xff\\"
    text = printable(raw)
    assert text == "ok\n\tline\\x1b[31mred\\x07\\x00é\\xff\\"
    assert all(ch in "\n\t" or ch.isprintable() for ch in text)


def test_bad_generation_arguments_are_rejected(model: GPT, device: torch.device) -> None:
    with pytest.raises(ValueError, match=r"must be >= 0, got -1\.0, 2"):
        plain_generate(model, torch.tensor([[1]], device=device), 2, temperature=-1.0)
