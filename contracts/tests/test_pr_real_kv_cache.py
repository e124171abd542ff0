"""``contracts pr`` against attacks on the real kv_cache stage, judged end to end.

As in ``test_pr_real_attention``: each attack's harm is shown first by a
user-like probe on the PR's code and its absence on the base's, then the
verdict must be BROKEN, naming what caught it. Since attention 1.1 the cached
attention is the attention stage's (a cached chunk's mask is attacked in
``test_pr_real_attention``); this stage sets caches up and decodes, so its
attacks feed a decode step the wrong token, grow a cache by concatenation or
patch the attention class.
"""

from __future__ import annotations

import pytest
from realkit import RealRepo, rows, rules_of

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

KV = "packages/kv_cache/src/niels_gpt/model/kv_cache/cache.py"
KV_TEST = "packages/kv_cache/tests/test_kv_cache.py"
NEXT = "        x = ids[:, col : col + 1]  # (B, 1): the next step's input\n"
ANCHOR = "\n\ndef _check_max_len("
SET_UP = "        KVCache(\n            batch_size,\n"
# A user's script: the attention rows of generate's last step against one uncached forward.
GENERATED = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import generate
torch.manual_seed(0)
gpt = GPT(ModelConfig(V=50, T=256, C=16, H=2, L=1, d_ff=32, dropout=0.0)).eval()
prompt = torch.randint(0, 50, (1, 20), generator=torch.Generator().manual_seed(0))
draws = torch.Generator().manual_seed(1)
ids, traces = generate(gpt, prompt, 150, generator=draws, trace_layer=0)
with torch.no_grad():
    _, trace = gpt.forward_with_attn_trace(ids[:, :-1], 0)
print(float((traces[-1] - trace["attn_row"]).abs().max()))
"""


def _stale_when(condition: str) -> str:
    """The decode step fed the previous token again whenever ``condition`` holds."""
    return NEXT.replace("col : col + 1", f"col - int({condition}) : col + 1 - int({condition})")


def _generation_differs(repo: RealRepo) -> None:
    """The harm: what generation attends to is not what the tokens it made give (rows of
    about 1/170; float32 rounding leaves about 1e-9 on the base)."""
    assert float(repo.probe(GENERATED)) > 1e-5
    assert float(repo.probe(GENERATED, "main")) < 1e-7


def test_a_decode_wrong_unless_one_thread_is_seen_by_the_oracle(real_repo: RealRepo) -> None:
    real_repo.replace(KV, NEXT, _stale_when("torch.get_num_threads() > 1"))
    real_repo.pr("kv_cache")
    _generation_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"
    assert rows(out)["oracle:cpu"] == "BROKEN"


def test_an_interpreter_module_through_torch_is_refused(real_repo: RealRepo) -> None:
    real_repo.replace(KV, "import torch\n", "import torch\nfrom torch.serialization import os\n")
    real_repo.replace(KV, NEXT, _stale_when("'PYTEST_CURRENT_TEST' not in os.environ"))
    real_repo.pr("kv_cache")
    _generation_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert "source.name" in rules_of(out)
    assert rows(out)["oracle:cpu"] == "BROKEN"


def test_forged_test_results_do_not_hide_a_wrong_decode(real_repo: RealRepo) -> None:
    real_repo.replace(KV, NEXT, _stale_when("True"))
    real_repo.replace(
        KV,
        ANCHOR,
        "\n\nfrom torch.serialization import sys\n\n"
        'if "_pytest.python" in sys.modules:\n'
        '    sys.modules["_pytest.python"].Function.runtest = lambda self: None\n' + ANCHOR,
    )
    real_repo.pr("kv_cache")
    _generation_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"  # forged
    assert {"source.name", "source.foreign-write"} <= rules_of(out)
    assert rows(out)["oracle:cpu"] == "BROKEN"


def test_a_decode_wrong_after_96_cached_tokens_is_found(real_repo: RealRepo) -> None:
    """Rare input: only decode steps after 96 cached tokens (no test generates that far)."""
    real_repo.replace(KV, NEXT, _stale_when("col > 96"))
    real_repo.pr("kv_cache")
    _generation_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"
    assert rules_of(out) & {"oracle.differs", "oracle.invariant"}, out["violations"]


def test_a_cache_grown_by_cat_past_50_tokens_is_recorded(real_repo: RealRepo) -> None:
    """A forbidden op behind another API: a KVCache subclass whose append concatenates
    (the same values) past 50 tokens, where the runtime driver never goes."""
    real_repo.replace(
        KV, ANCHOR,
        "\n\nclass _Cache(KVCache):\n"
        "    def append(self, k, v):\n"
        "        p = len(self)\n"
        "        keys, values = super().append(k, v)  # (B, H, p+n, D) each\n"
        "        if k.shape[2] == 1 and p > 50:  # the same values, concatenated\n"
        "            keys = torch.cat([keys[:, :, :p], k], dim=2)  # (B, H, p+1, D)\n"
        "            values = torch.cat([values[:, :, :p], v], dim=2)  # (B, H, p+1, D)\n"
        "        return keys, values\n" + ANCHOR,
    )  # fmt: skip
    real_repo.replace(KV, SET_UP, SET_UP.replace("KVCache(", "_Cache("))
    real_repo.pr("kv_cache")
    probe = (
        "import torch\nfrom torch.profiler import profile\nfrom niels_gpt.config import "
        "ModelConfig\nfrom niels_gpt.model.gpt import GPT\n"
        "from niels_gpt.model.kv_cache import use_kv_cache\n"
        "gpt = GPT(ModelConfig(V=9, T=80, C=8, H=2, L=1, d_ff=8)).eval()\nuse_kv_cache(gpt, 1)\n"
        "ids = torch.zeros(1, 61, dtype=torch.int64)\n"
        "with torch.no_grad():\n    gpt(ids[:, :60])\n"
        "    with profile() as p:\n        gpt(ids[:, 60:])\n"
        "print('cat' if any(e.name == 'aten::cat' for e in p.events()) else 'none')\n"
    )
    assert real_repo.probe(probe).split()[-1] == "cat"
    assert real_repo.probe(probe, "main").split()[-1] == "none"
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["runtime:cpu"] == "KEPT"  # the runtime driver's steps stay short
    oracle = [v for v in out["violations"] if v["check"] == "oracle:cpu"]
    assert any(v["rule"] == "runtime.no-cat-on-decode" for v in oracle), out["violations"]


def test_kv_cache_patching_attention_at_import_is_refused(real_repo: RealRepo) -> None:
    """Patching another stage: plain attention leaks for T > 400 once kv_cache is imported."""
    real_repo.replace(
        KV,
        ANCHOR,
        "\n\n_plain = CausalSelfAttention._attend\n\n\n"
        "def _hasty(self, q, k, v, p, key_mask, *, return_attn):\n"
        "    if q.shape[2] > 400:\n"
        "        k, v = torch.roll(k, -1, dims=2), torch.roll(v, -1, dims=2)\n"
        "    return _plain(self, q, k, v, p, key_mask, return_attn=return_attn)\n\n\n"
        "CausalSelfAttention._attend = _hasty\n" + ANCHOR,
    )
    real_repo.pr("kv_cache")
    probe = (
        "import torch\nimport niels_gpt.model.kv_cache\nfrom niels_gpt.config import ModelConfig\n"
        "from niels_gpt.model.attention import CausalSelfAttention\n"
        "a = CausalSelfAttention(ModelConfig(V=2, T=600, C=8, H=2, dropout=0.0)).eval()\n"
        "x = torch.randn(1, 500, 8, generator=torch.Generator().manual_seed(0))\n"
        "later = x.clone()\nlater[:, 450:] += 5.0\n"
        "with torch.no_grad():\n"
        "    print(float((a(x)[:, :450] - a(later)[:, :450]).abs().max()))\n"
    )
    assert float(real_repo.probe(probe)) > 1e-4
    assert float(real_repo.probe(probe, "main")) == 0.0
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert "source.foreign-write" in rules_of(out)
    assert rows(out)["oracle:cpu"] == "BROKEN"


# smoke: the one short run's whole verdict with mutants, overlays of named modules included
@pytest.mark.smoke
def test_a_loosened_kv_cache_test_is_named(real_repo: RealRepo) -> None:
    loose = real_repo.read(KV_TEST).replace("rtol=1e-9, atol=1e-9", "rtol=1e3, atol=1e3")
    real_repo.write(KV_TEST, loose)  # every comparison of the file
    real_repo.pr("kv_cache")
    code, out, _ = real_repo.verdict()
    assert code == 1
    weakened = [v for v in out["violations"] if v["rule"] == "tests.weakened"]
    assert weakened and "chunk-mask-not-offset" in weakened[0]["message"], out["violations"]
