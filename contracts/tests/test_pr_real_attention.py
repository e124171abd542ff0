"""``contracts pr`` against attacks on the real attention stage, judged end to end.

Each scenario is a PR on the real-stage scenario repository (``realkit``).
Its harm is proved first, outside the gate: a probe run as a user would run
it (a plain process, default threads, the stage imported from the PR's
sources) shows the leak or the forbidden op on the PR's code and not on the
base's. Then the verdict must be BROKEN, naming what caught it.
"""

from __future__ import annotations

import pytest
from realkit import RealRepo, rows, rules_of

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

ATTN = "packages/attention/src/niels_gpt/model/attention/causal.py"
ATTN_TEST = "packages/attention/tests/test_attention.py"
INIT_MASK = "        mask = torch.tril(torch.ones(cfg.T, cfg.T, dtype=torch.bool))  # (T, T)\n"
VISIBLE = "            visible = allowed[:, :, rows, :r1]  # (B or 1, 1, R, r1) view\n"
ATTEND = (
    "        out, probs = self._core(q, k, v, p, key_mask, return_attn, plain)  # (B, T, H, D)\n"
)
ALL = (
    '__all__ = ["AttentionKernel", "CausalSelfAttention", "KVCache", "attention_modules", '
    '"rotate_rows"]\n'
)
# A user's script: how far do outputs before position `cut` move when later tokens change?
LEAK = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.attention import CausalSelfAttention
attn = CausalSelfAttention(ModelConfig(V=2, T=1024, C=8, H=2, dropout=0.0)).eval()
x = torch.randn(1, 700, 8, generator=torch.Generator().manual_seed(1))
later = x.clone()
later[:, 600:] += 5.0
with torch.no_grad():
    print(float((attn(x)[:, :600] - attn(later)[:, :600]).abs().max()))
"""


def _mask_shifted_when(condition: str) -> str:
    """attention's mask line, one future token visible whenever ``condition`` holds."""
    return INIT_MASK.replace("dtype=torch.bool))", f"dtype=torch.bool), diagonal=int({condition}))")


def _leaks(repo: RealRepo) -> None:
    """The harm: earlier outputs depend on later tokens on the PR's code, not on the base's."""
    assert float(repo.probe(LEAK)) > 1e-4
    assert float(repo.probe(LEAK, "main")) == 0.0


def test_leaking_unless_one_thread_is_seen_by_the_oracle(real_repo: RealRepo) -> None:
    """Behaves only when watched: the sandbox's tests pin one thread, a user's run has more."""
    real_repo.replace(ATTN, INIT_MASK, _mask_shifted_when("torch.get_num_threads() > 1"))
    real_repo.pr("attention")
    _leaks(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    status = rows(out)
    assert status["tests:cpu"] == "KEPT"  # the tests never see it
    assert status["oracle:cpu"] == "BROKEN"
    assert "oracle.differs" in rules_of(out)


def test_an_interpreter_module_through_torch_is_refused_and_the_leak_seen(
    real_repo: RealRepo,
) -> None:
    """``from torch.serialization import os``: leak unless a pytest variable is set."""
    real_repo.replace(ATTN, "import torch\n", "import torch\nfrom torch.serialization import os\n")
    real_repo.replace(
        ATTN, INIT_MASK, _mask_shifted_when("'PYTEST_CURRENT_TEST' not in os.environ")
    )
    real_repo.pr("attention")
    _leaks(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert {"source.name", "oracle.differs"} <= rules_of(out)


def test_forged_test_results_do_not_hide_the_leak(real_repo: RealRepo) -> None:
    """The stage always leaks and, when imported under pytest, makes every test pass."""
    real_repo.replace(ATTN, INIT_MASK, _mask_shifted_when("True"))
    real_repo.replace(
        ATTN,
        ALL,
        ALL + "\nfrom torch.serialization import sys\n\n"
        'if "_pytest.python" in sys.modules:\n'
        '    sys.modules["_pytest.python"].Function.runtest = lambda self: None\n',
    )
    real_repo.pr("attention")
    _leaks(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"  # forged: the tests "pass"
    assert {"source.name", "source.foreign-write", "oracle.differs"} <= rules_of(out)


def test_a_leak_only_past_position_512_is_found(real_repo: RealRepo) -> None:
    """Rare input: query blocks from 512 on see one future token; no test goes that far."""
    real_repo.replace(
        ATTN, VISIBLE,
        VISIBLE + "            if r0 >= 512 and key_mask is None:\n"
                  "                visible = self.mask[:, :, r0 + 1 : r1 + 1, :r1]\n",
    )  # fmt: skip
    real_repo.pr("attention")
    assert float(real_repo.probe(LEAK.replace("600", "520"))) > 1e-4
    assert float(real_repo.probe(LEAK.replace("600", "520"), "main")) == 0.0
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"
    differs = [v for v in out["violations"] if v["rule"] == "oracle.differs"]
    assert differs and differs[0]["message"].startswith("attention: ")
    assert "call sweep/" in differs[0]["message"]


ALLOWED = "        allowed = self.mask[:, :, p:S, :S]  # (1, 1, T, S) view of the tril buffer\n"
# A user's script: a context fed through the KV cache in chunks of 20, against one forward.
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


def test_a_cached_chunk_mask_wrong_after_96_cached_tokens_is_found(real_repo: RealRepo) -> None:
    """Rare input: a chunk of two or more tokens after 96 cached ones sees one future key."""
    real_repo.replace(
        ATTN, ALLOWED,
        ALLOWED + "        if p > 96 and T > 1:\n"
                  "            allowed = self.mask.new_ones(T, S).tril(p + 1)[None, None]\n",
    )  # fmt: skip
    real_repo.pr("attention")
    assert float(real_repo.probe(CHUNKED)) > 1e-4
    assert float(real_repo.probe(CHUNKED, "main")) < 1e-5
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"  # no test caches 97 tokens
    oracle = ("oracle.differs", "oracle.invariant", "oracle.follows")
    found = [v for v in out["violations"] if v["rule"] in oracle]
    # attention's own v2 calls against the float64 reference; kv_cache's chunks follow
    mine = [v["message"] for v in found if v["message"].startswith("attention: ")]
    assert any("call v2/" in m for m in mine), found
    follows = "kv_cache: follows from attention"
    assert any(v["message"].startswith(follows) for v in found), found


FUSED = """
    def _fused(self, x, q, k, v):
        B, H, T, D = q.shape
        flat = [t.transpose(1, 2).reshape(B, T, H * D).transpose(0, 1) for t in (q, k, v)]
        eye = torch.eye(H * D, dtype=x.dtype)
        out, _ = torch.nn.functional.multi_head_attention_forward(
            *flat, H * D, H, None, None, None, None, False, 0.0, eye, None,
            training=False, need_weights=False, attn_mask=~self.mask[0, 0, :T, :T],
            use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye,
            v_proj_weight=eye,
        )
        return self.resid_dropout(self.proj(out.transpose(0, 1)))

    def _rope_operands("""


@pytest.mark.parametrize("longer", [160, 2], ids=["past-the-runtime-driver", "always"])
def test_sdpa_behind_multi_head_attention_is_recorded(real_repo: RealRepo, longer: int) -> None:
    """A forbidden op behind another API, for eval inputs longer than ``longer``: past the
    runtime driver's T = 160 only the oracle sees it; from T = 3 on, the tests do too."""
    real_repo.replace(
        ATTN, ATTEND,
        f"        if not return_attn and not self.training and plain and T > {longer}:\n"
        "            return self._fused(x, q, k, v)\n" + ATTEND,
    )  # fmt: skip
    real_repo.replace(ATTN, "\n    def _rope_operands(", FUSED)
    real_repo.pr("attention")
    probe = (
        "import torch\nfrom torch.profiler import profile\nfrom niels_gpt.config import "
        "ModelConfig\nfrom niels_gpt.model.attention import CausalSelfAttention\n"
        "a = CausalSelfAttention(ModelConfig(V=2, T=300, C=8, H=2)).eval()\n"
        "with torch.no_grad(), profile() as p:\n    a(torch.randn(1, 200, 8))\n"
        "print('sdpa' if any('scaled_dot_product' in e.name for e in p.events()) else 'none')\n"
    )
    assert real_repo.probe(probe).split()[-1] == "sdpa"
    assert real_repo.probe(probe, "main").split()[-1] == "none"
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    caught = {v["check"] for v in out["violations"] if v["rule"] == "runtime.no-sdpa-runtime"}
    if longer == 160:
        assert "oracle:cpu" in caught
        assert "tests:cpu" not in caught and "runtime:cpu" not in caught  # T stays small there
    else:
        assert {"oracle:cpu", "tests:cpu", "runtime:cpu"} <= caught, out["violations"]


def test_a_stage_that_rebinds_rope_is_refused(real_repo: RealRepo) -> None:
    """Patching another stage: attention swaps rope's apply_rope at import (k left unrotated)."""
    real_repo.replace(
        ATTN, ALL,
        ALL + '\n_real = rope.apply_rope\n\n\n'
        "def _lazy(q, k, sin, cos):\n    return _real(q, k, sin, cos)[0], k\n\n\n"
        "rope.apply_rope = _lazy\n",
    )  # fmt: skip
    real_repo.pr("attention")
    probe = (
        "import torch\nimport niels_gpt.model.rope as rope\nimport niels_gpt.model.attention\n"
        "q = torch.randn(1, 1, 4, 4)\nsin, cos = rope.rope_cache(4, 4)\n"
        "print(float((rope.apply_rope(q, q, sin, cos)[1] - q).abs().max()))\n"
    )
    assert float(real_repo.probe(probe)) == 0.0  # k comes back unrotated
    assert float(real_repo.probe(probe, "main")) > 0.1
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert {"source.foreign-write", "oracle.differs"} <= rules_of(out)


def test_a_loosened_test_is_named_though_the_code_is_right(real_repo: RealRepo) -> None:
    """Weakened tests: a tolerance of 1e3 lets the catalogued no-scale bug through."""
    loose = real_repo.read(ATTN_TEST).replace("rtol=1e-9, atol=1e-9", "rtol=1e3, atol=1e3")
    real_repo.write(ATTN_TEST, loose)  # every comparison of the file
    real_repo.pr("attention")
    code, out, _ = real_repo.verdict()
    assert code == 1
    weakened = [v for v in out["violations"] if v["rule"] == "tests.weakened"]
    assert weakened and "no-scale" in weakened[0]["message"], out["violations"]
    assert ATTN_TEST in weakened[0]["message"]
    assert rows(out)["mutants"] == "KEPT"  # the base's versions of the tests still judge it


@pytest.mark.parametrize(
    "condition",
    ["torch.initial_seed() > 2**32", "'contracts' not in __file__"],
    ids=["leak-when-unseeded", "leak-outside-the-workspace"],
)
def test_code_that_tells_a_test_run_from_a_user_is_caught(
    real_repo: RealRepo, condition: str
) -> None:
    """Own variants: tests seed torch (small seeds) and run from the checker's workspace;
    users do neither (torch seeds a fresh process with a random 64-bit number)."""
    real_repo.replace(ATTN, INIT_MASK, _mask_shifted_when(condition))
    real_repo.pr("attention")
    _leaks(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"  # every test seeds, and runs from the workspace
    assert "oracle.differs" in rules_of(out)
