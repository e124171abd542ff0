"""``contracts pr`` against attacks on the real padding stage, judged end to end.

As in ``test_pr_real_attention``: each attack's harm is shown first by a
user-like probe on the PR's code and its absence on the base's, then the
verdict must be BROKEN, naming what caught it.
"""

from __future__ import annotations

import pytest
from realkit import RealRepo, rows, rules_of

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run runs a subset

PAD = "packages/padding/src/niels_gpt/model/padding/_frame.py"
PADDING = "packages/padding/src/niels_gpt/model/padding/padded.py"
PAD_TEST = "packages/padding/tests/test_padding.py"
PAD_KEY = '            "key_mask": cols[None, :] >= pads,  # (B, p + n), True = a real key\n'
IMPORT = "from niels_gpt.model.attention import attention_modules\n"
HOOK = "        return args, {**kwargs, **frame.arguments(p, args[0].shape[1])}\n"
# A user's script: the padded row's logits against the same row alone.
PADDED = """
import torch
from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.padding import padded_forward
gpt = GPT(ModelConfig(V=50, T=256, C=16, H=2, L=1, d_ff=32, dropout=0.0)).eval()
ids = torch.randint(0, 50, (2, 120), generator=torch.Generator().manual_seed(0))
mask = torch.ones(2, 120, dtype=torch.bool)
mask[0, :40] = False
with torch.no_grad():
    got, alone = padded_forward(gpt, ids, mask), gpt(ids[:1, 40:])
print(float((got[:1, 40:] - alone).abs().max()))
"""


def _last_pad_seen_when(condition: str) -> str:
    """The key mask lets each row's last pad through whenever ``condition`` holds."""
    return PAD_KEY.replace(">= pads,", f">= pads - int({condition}),")


def _padded_differs(repo: RealRepo) -> None:
    assert float(repo.probe(PADDED)) > 1e-3
    assert float(repo.probe(PADDED, "main")) < 1e-4


def test_a_key_mask_wrong_unless_one_thread_is_seen_by_the_oracle(real_repo: RealRepo) -> None:
    real_repo.replace(PAD, PAD_KEY, _last_pad_seen_when("torch.get_num_threads() > 1"))
    real_repo.pr("padding")
    _padded_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"
    assert rows(out)["oracle:cpu"] == "BROKEN"


def test_an_interpreter_module_through_torch_is_refused(real_repo: RealRepo) -> None:
    real_repo.replace(PAD, "import torch\n", "import torch\nfrom torch.serialization import os\n")
    real_repo.replace(PAD, PAD_KEY, _last_pad_seen_when("'PYTEST_CURRENT_TEST' not in os.environ"))
    real_repo.pr("padding")
    _padded_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert "source.name" in rules_of(out)
    assert rows(out)["oracle:cpu"] == "BROKEN"


def test_forged_test_results_do_not_hide_a_wrong_key_mask(real_repo: RealRepo) -> None:
    real_repo.replace(PAD, PAD_KEY, _last_pad_seen_when("True"))
    real_repo.replace(
        PAD,
        IMPORT,
        IMPORT + "from torch.serialization import sys\n\n"
        'if "_pytest.python" in sys.modules:\n'
        '    sys.modules["_pytest.python"].Function.runtest = lambda self: None\n',
    )
    real_repo.pr("padding")
    _padded_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"  # forged
    assert {"source.name", "source.foreign-write"} <= rules_of(out)
    assert rows(out)["oracle:cpu"] == "BROKEN"


def test_a_key_mask_wrong_only_past_30_pads_is_found(real_repo: RealRepo) -> None:
    """Rare input: rows with 30 pads or more, which no test builds."""
    real_repo.replace(PAD, PAD_KEY, PAD_KEY.replace(">= pads,", ">= pads - (pads >= 30).long(),"))
    real_repo.pr("padding")
    _padded_differs(real_repo)
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert rows(out)["tests:cpu"] == "KEPT"
    assert rules_of(out) & {"oracle.differs", "oracle.invariant"}, out["violations"]


FUSED = """

def _fused(hidden):
    \"\"\"A kernel over SDPA through multi_head_attention_forward, with the frame's mask.\"\"\"

    def kernel(q, k, v, dropout_p, scale):
        b, h, n, d = q.shape
        flat = [t.transpose(1, 2).reshape(b, n, h * d).transpose(0, 1) for t in (q, k, v)]
        eye = torch.eye(h * d, dtype=q.dtype)
        causal = torch.ones(n, n, dtype=torch.bool).tril()  # (n, n)
        mask = ~(causal[None] & hidden[:, None, :])  # (B, n, n), True = hidden
        out, _ = torch.nn.functional.multi_head_attention_forward(
            *flat, h * d, h, None, None, None, None, False, 0.0, eye, None,
            training=False, need_weights=False,
            attn_mask=mask[:, None].expand(b, h, n, n).reshape(b * h, n, n),
            use_separate_proj_weight=True, q_proj_weight=eye, k_proj_weight=eye,
            v_proj_weight=eye,
        )
        return out.transpose(0, 1).reshape(b, n, h, d).nan_to_num(0.0).transpose(1, 2)

    return kernel
"""
LONG = """\
        n = args[0].shape[1]
        if cache is None and n > 200 and not module.training:  # long batches: a fused kernel
            keywords = frame.arguments(p, n)
            module.kernel = _fused(keywords["key_mask"])
            return args, {**kwargs, "positions": keywords["positions"]}
"""


def test_attention_behind_multi_head_attention_is_recorded(real_repo: RealRepo) -> None:
    """A forbidden op behind another API: for padded batches longer than 200 the frame
    hands the attention a kernel of its own (SDPA through multi_head_attention_forward,
    the same numbers) and no key mask, so the one attention takes the kernel path."""
    real_repo.replace(PAD, "\n\n@contextmanager\n", FUSED + "\n\n@contextmanager\n")
    real_repo.replace(PAD, HOOK, LONG + HOOK)
    saved = "    kernels = [(m, m.kernel) for _, m in attention_modules(model)]\n"
    real_repo.replace(PAD, "    handles = []\n", "    handles = []\n" + saved)
    real_repo.replace(
        PAD, "            handle.remove()\n", "            handle.remove()\n"
        "        for m, kernel in kernels:\n            m.kernel = kernel\n"
    )  # fmt: skip
    real_repo.pr("padding")
    probe = PADDED.replace("with torch.no_grad():", "from torch.profiler import profile\n"
                           "with torch.no_grad(), profile() as prof:").replace(
        "print(float(", "print(sorted({e.name for e in prof.events() if 'multi_head' in e.name "
        "or 'scaled_dot' in e.name}))\nprint(float(")  # fmt: skip
    fused = real_repo.probe(probe.replace("120", "240"))
    assert "attention" in fused.splitlines()[0], fused
    assert real_repo.probe(probe.replace("120", "240"), "main").splitlines()[0] == "[]"
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    oracle = [v for v in out["violations"] if v["check"] == "oracle:cpu"]
    assert any(v["rule"] == "runtime.no-sdpa-runtime" for v in oracle), out["violations"]


@pytest.mark.smoke
def test_padding_rebinding_kv_cache_sampling_is_refused(real_repo: RealRepo) -> None:
    """Patching another stage: padding swaps kv_cache's filter_logits (top-k keeps one more)."""
    real_repo.replace(
        PADDING,
        "Knobs = tuple[float, int | None, float | None]\n",
        "Knobs = tuple[float, int | None, float | None]\n\n_filter = kv_cache.filter_logits\n\n\n"
        "def _wider(logits, *, temperature=1.0, top_k=None, top_p=None):\n"
        "    k = None if top_k is None else top_k + 1\n"
        "    return _filter(logits, temperature=temperature, top_k=k, top_p=top_p)\n\n\n"
        "kv_cache.filter_logits = _wider\n",
    )
    real_repo.pr("padding")
    probe = (
        "import torch\nimport niels_gpt.model.padding\nfrom niels_gpt.model.kv_cache import "
        "filter_logits\nimport niels_gpt.model.kv_cache as kv\n"
        "x = torch.tensor([[3.0, 2.0, 1.0]])\n"
        "print(int(torch.isfinite(kv.filter_logits(x, top_k=1)).sum()))\n"
    )
    assert real_repo.probe(probe).split()[-1] == "2"
    assert real_repo.probe(probe, "main").split()[-1] == "1"
    code, out, _ = real_repo.verdict("--skip-mutants")
    assert code == 1
    assert "source.foreign-write" in rules_of(out)


def test_a_loosened_padding_test_is_named(real_repo: RealRepo) -> None:
    loose = real_repo.read(PAD_TEST).replace("rtol=1e-9, atol=1e-9", "rtol=1e3, atol=1e3")
    real_repo.write(PAD_TEST, loose)  # every comparison of the file
    real_repo.pr("padding")
    code, out, _ = real_repo.verdict()
    assert code == 1
    weakened = [v for v in out["violations"] if v["rule"] == "tests.weakened"]
    assert weakened and "key-mask-missing" in weakened[0]["message"], out["violations"]
