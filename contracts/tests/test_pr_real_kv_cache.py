"""``contracts pr`` against attacks on the real kv_cache stage, judged end to end.

As in ``test_pr_real_attention``: each attack's harm is shown first by a
user-like probe on the PR's code and its absence on the base's, then the
verdict must be BROKEN, naming what caught it.
"""

from __future__ import annotations

from realkit import RealRepo, rows, rules_of

KV = "packages/kv_cache/src/niels_gpt/model/kv_cache.py"
KV_TEST = "packages/kv_cache/tests/test_kv_cache.py"
VISIBLE = (
    "            visible = self.mask[:, :, p:end, :end]  # (1, 1, n, p+n) view of the tril buffer\n"
)
APPEND = "        keys, values = cache._append(k, v)  # (B, H, p+n, D) each, views of the cache\n"
# A user's script: a context fed through the cache in chunks of 20, against one uncached forward.
CHUNKED = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import drop_kv_cache, use_kv_cache
gpt = GPT(ModelConfig(V=50, T=256, C=16, H=2, L=1, d_ff=32, dropout=0.0)).eval()
ids = torch.randint(0, 50, (1, 200), generator=torch.Generator().manual_seed(0))
with torch.no_grad():
    full = gpt(ids)
    use_kv_cache(gpt, 1)
    parts = [gpt(ids[:, i : i + 20]) for i in range(0, 200, 20)]
    drop_kv_cache(gpt)
print(float((torch.cat(parts, 1) - full).abs().max()))
"""


def _shift_when(condition: str) -> str:
    """The chunk mask shifted one token into the future whenever ``condition`` holds."""
    return VISIBLE.replace("p:end", f"p + int({condition}) : end + int({condition})")


def _cached_differs(repo: RealRepo) -> None:
    """The harm: cached logits are not the uncached ones (float32 rounding is about 1e-6)."""
    assert float(repo.probe(CHUNKED)) > 1e-4
    assert float(repo.probe(CHUNKED, "main")) < 1e-5


def test_a_mask_wrong_unless_one_thread_is_seen_by_the_oracle(real_repo: RealRepo) -> None:
    real_repo.replace(KV, VISIBLE, _shift_when("torch.get_num_threads() > 1"))
    real_repo.pr("kv_cache")
    _cached_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"
    assert rows(out)["oracle:cpu"] == "BROKEN"


def test_an_interpreter_module_through_torch_is_refused(real_repo: RealRepo) -> None:
    real_repo.replace(KV, "import torch\n", "import torch\nfrom torch.serialization import os\n")
    real_repo.replace(KV, VISIBLE, _shift_when("'PYTEST_CURRENT_TEST' not in os.environ"))
    real_repo.pr("kv_cache")
    _cached_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert "source.name" in rules_of(out)
    assert rows(out)["oracle:cpu"] == "BROKEN"


def test_forged_test_results_do_not_hide_a_wrong_cache(real_repo: RealRepo) -> None:
    real_repo.replace(KV, VISIBLE, _shift_when("True"))
    real_repo.replace(
        KV,
        "# The fast path is recognised by name",
        "from torch.serialization import sys\n\n"
        'if "_pytest.python" in sys.modules:\n'
        '    sys.modules["_pytest.python"].Function.runtest = lambda self: None\n\n'
        "# The fast path is recognised by name",
    )
    real_repo.pr("kv_cache")
    _cached_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"  # forged
    assert {"source.name", "source.foreign-write"} <= rules_of(out)
    assert rows(out)["oracle:cpu"] == "BROKEN"


def test_a_chunk_mask_wrong_after_96_cached_tokens_is_found(real_repo: RealRepo) -> None:
    """Rare input: only chunks of two or more tokens after 96 cached ones."""
    real_repo.replace(KV, VISIBLE, _shift_when("p > 96"))
    real_repo.pr("kv_cache")
    _cached_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"
    assert rules_of(out) & {"oracle.differs", "oracle.invariant"}, out["violations"]


def test_a_cache_grown_by_cat_past_50_tokens_is_recorded(real_repo: RealRepo) -> None:
    """A forbidden op where the runtime driver never goes (its decode steps stop at 11)."""
    real_repo.replace(
        KV, APPEND,
        APPEND + "        if n == 1 and p > 50:  # the same values, concatenated\n"
                 "            keys = torch.cat([keys[:, :, :p], k], dim=2)  # (B, H, p+1, D)\n"
                 "            values = torch.cat([values[:, :, :p], v], dim=2)  # (B, H, p+1, D)\n",
    )  # fmt: skip
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
        "# The fast path is recognised by name",
        "_plain = CausalSelfAttention._attend\n\n\n"
        "def _hasty(self, q, k, v, *, return_attn):\n"
        "    if q.shape[2] > 400:\n"
        "        k, v = torch.roll(k, -1, dims=2), torch.roll(v, -1, dims=2)\n"
        "    return _plain(self, q, k, v, return_attn=return_attn)\n\n\n"
        "CausalSelfAttention._attend = _hasty\n\n"
        "# The fast path is recognised by name",
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


def test_a_loosened_kv_cache_test_is_named(real_repo: RealRepo) -> None:
    loose = real_repo.read(KV_TEST).replace("rtol=1e-9, atol=1e-9", "rtol=1e3, atol=1e3")
    real_repo.write(KV_TEST, loose)  # every comparison of the file
    real_repo.pr("kv_cache")
    code, out, _ = real_repo.verdict()
    assert code == 1
    weakened = [v for v in out["violations"] if v["rule"] == "tests.weakened"]
    assert weakened and "scale-one-over-d" in weakened[0]["message"], out["violations"]
