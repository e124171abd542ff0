"""A run trained with grouped-query attention (``niels-train --kv-heads``) loads and serves.

The tiny run of the other tests, trained with 2 key/value heads for its 4
query heads: its checkpoint loads (``qkv`` of ``C + 2 * 2 * D`` rows), the
cached engine's caches hold 2 heads, batched generation equals the stage's
``generate`` row by row, and the attention view shows every query head.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
import torch

from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import generate
from niels_gpt_experiments.loading import load_run
from niels_gpt_serve.app import Served, create_app
from niels_gpt_serve.local import ThreadServer
from niels_gpt_serve.trained import read_training

from .conftest import TINY_FLAGS, script, write_corpus


@pytest.fixture(scope="module")
def gqa_served(tmp_path_factory: pytest.TempPathFactory) -> Served:
    root = tmp_path_factory.mktemp("gqa")
    out = root / "runs" / "gqa"
    subprocess.run(
        [script("niels-train"), "--corpus", str(write_corpus(root / "corpus")),
         "--data-dir", str(root / "data"), "--out", str(out), *TINY_FLAGS, "--kv-heads", "2"],
        check=True, capture_output=True, text=True, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    run = load_run(out, device="cpu")
    assert isinstance(run.model, GPT)
    return Served(
        run.model, run.config, run.arch, out.name, run.step, read_training(out, run.step, run.meta)
    )


def test_a_grouped_query_run_loads_serves_and_shows_every_query_head(
    gqa_served: Served, tmp_path: Path
) -> None:
    cfg, model = gqa_served.config, gqa_served.model
    assert (cfg.H, cfg.kv_heads) == (4, 2)
    assert model.blocks[0].attn.qkv.weight.shape == (cfg.C + 2 * 2 * cfg.head_dim, cfg.C)
    prompts = ["def f(x):", "class A:\n    "]
    with (
        ThreadServer(create_app(gqa_served)) as url,
        httpx.Client(base_url=url, timeout=60) as http,
    ):
        info = http.get("/api/model").json()
        assert (info["H"], info["H_kv"]) == (4, 2)
        for prompt in prompts:  # greedy: the stage's tokens, through the app's batched cache
            body = {"prompt": prompt, "max_new_tokens": 12, "temperature": 0, "seed": 1}
            got = http.post("/api/generate", json=body).json()["tokens"]
            ids = torch.tensor([list(prompt.encode())])  # (1, t)
            want = generate(model, ids, 12, temperature=0.0)  # (1, t + 12)
            assert got == want[0, ids.shape[1] :].tolist()
        tokens = list(b"def f(x):")
        answer = http.post("/api/attention", json={"tokens": tokens}).json()
    assert answer["heads"] == list(range(cfg.H))  # every query head, not the 2 K/V heads
    shown = torch.tensor(answer["attention"], dtype=torch.float64)  # (L, H, t, t)
    assert shown.shape == (cfg.L, cfg.H, len(tokens), len(tokens))
    _, trace = model.forward_with_attn_trace(torch.tensor([tokens]), 1, return_full_attn=True)
    assert trace["attn_full"] is not None
    torch.testing.assert_close(shown[1], trace["attn_full"][0].double(), rtol=0, atol=5e-7)
