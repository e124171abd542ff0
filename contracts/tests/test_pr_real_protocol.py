"""``contracts pr`` on what every ``nn.Module`` promises, on the real stages (issue 45).

Each PR stays inside its stage's allowlist, passes the stage's own tests and
keeps the numbers the oracle's grid sees, and still harms a user: a model
that no longer pickles, holds a second copy of a weight, ignores the
caller's seed, skips its submodules' hooks, leaves a global setting changed,
breaks ``torch.compile``'s graph, recompiles its decode step at every token,
moves its checkpoint format, goes wrong past the grid's sizes, or computes
otherwise on one device type. The harm is shown first by a user's script on
the PR's code and on the base's; then the verdict must be BROKEN by the
protocol rule aimed at it (``protocol`` phase, or the static
``device-branches`` row). No stage's spec names any of these promises: the
phase derives them from the API.

The verdicts stop at the first BROKEN row (no ``--full``): the protocol
runs before the runtime drivers and the oracle, so each takes a couple of
minutes.
"""

from __future__ import annotations

from typing import Any

import pytest
from realkit import RealRepo, rows, rules_of

from niels_gpt_contracts.verdict import pr

pytestmark = pytest.mark.scenario  # nox -s test-scenarios; .ci/run --full

ATTN = "packages/attention/src/niels_gpt/model/attention/causal.py"
LAYERS = "packages/backbone_v1/src/niels_gpt/model/blocks/layers.py"
BLOCK = "packages/block/src/niels_gpt/model/block_v0/block.py"
SDPA = "packages/fastpath/src/niels_gpt/model/fastpath/sdpa.py"
CACHE = "packages/kv_cache/src/niels_gpt/model/kv_cache/cache.py"
ROPE = "packages/rope/src/niels_gpt/model/rope/rotary.py"
DROPOUTS = "        self.resid_dropout = nn.Dropout(cfg.dropout)\n"
QKV = (
    "        q, k, v = self.qkv(x).split((C, Hk * D, Hk * D), dim=-1)"
    "  # (B, T, C), (B, T, Hk*D) x2\n"
)
SWIGLU = "        h = F.silu(g) * a  # (B, T, F)\n"
BLOCK_MLP = "        x = x + self.dropout(self.mlp(self.ln2(x)))  # (B, T, C)\n"
SETUP = "import torch\nfrom niels_gpt.config import ModelConfig\n"


def _broken_by(repo: RealRepo, rule: str, check: str = "protocol") -> dict[str, Any]:
    code, out, _ = repo.verdict_stopping()
    assert code == 1, rows(out)
    assert rows(out)[check] == "BROKEN", rows(out)
    assert rule in rules_of(out), [v["message"][:300] for v in out["violations"]]
    return out


def test_a_module_that_no_longer_pickles_is_refused(real_repo: RealRepo) -> None:
    """A scale helper bound at construction: a local function on every attention
    module, so ``torch.save(model)``, ``pickle`` and spawn workers fail."""
    real_repo.replace(
        ATTN, DROPOUTS, DROPOUTS + "        self.scaled = lambda t: t * self.head_dim**-0.5\n"
    )
    real_repo.pr("attention")
    user = SETUP + (
        "import pickle\nfrom niels_gpt.model.attention import CausalSelfAttention\n"
        "try:\n    pickle.dumps(CausalSelfAttention(ModelConfig(V=2, T=8, C=8, H=2)))\n"
        "    print('ok')\nexcept Exception as err:\n    print(type(err).__name__)\n"
    )
    assert real_repo.probe(user).strip() != "ok"
    assert real_repo.probe(user, "main").strip() == "ok"
    _broken_by(real_repo, "protocol.round-trip")


def test_attention_that_keeps_a_copy_of_its_weight_is_refused(real_repo: RealRepo) -> None:
    """'One fused read a decode step': the qkv weight transposed once and kept on the
    module after the first call without grad, a second copy of the largest weight."""
    real_repo.replace(
        ATTN,
        QKV,
        "        if not torch.is_grad_enabled():  # decode: a contiguous W^T read once\n"
        '            if getattr(self, "_wt", None) is None:\n'
        "                self._wt = self.qkv.weight.t().contiguous()  # (C, C + 2 H_kv D)\n"
        "            q, k, v = (x @ self._wt).split((C, Hk * D, Hk * D), dim=-1)\n"
        "        else:\n"
        "    " + QKV,
    )
    real_repo.pr("attention")
    user = SETUP + (
        "import gc\nfrom niels_gpt.model.attention import CausalSelfAttention\n"
        "attn = CausalSelfAttention(ModelConfig(V=2, T=8, C=64, H=2))\n"
        "with torch.no_grad():\n    attn(torch.randn(1, 3, 64))\n"
        "gc.collect()\nseen = {o.untyped_storage().data_ptr(): o.untyped_storage().nbytes()\n"
        "        for o in gc.get_objects() if isinstance(o, torch.Tensor)}\n"
        "print(sum(seen.values()))\n"
    )
    assert int(real_repo.probe(user)) >= int(real_repo.probe(user, "main")) + 4 * 64 * 192
    _broken_by(real_repo, "protocol.memory")


def test_an_init_that_ignores_the_callers_seed_is_refused(real_repo: RealRepo) -> None:
    """'Reproducible builds': each linear drawn from a generator seeded by its size,
    so ``torch.manual_seed`` no longer changes the model and every block starts as
    every other."""
    real_repo.replace(
        LAYERS,
        "    block_v0.init_weights(module)\n",
        "    block_v0.init_weights(module)\n"
        "    if isinstance(module, nn.Linear):  # the same weights on every machine\n"
        "        gen = torch.Generator().manual_seed(module.weight.numel())\n"
        "        with torch.no_grad():\n"
        "            module.weight.normal_(0.0, 0.02, generator=gen)\n",
    )
    real_repo.pr("backbone_v1")
    user = SETUP + (
        "from niels_gpt.model.gpt import GPT\ncfg = ModelConfig(V=16, T=8, C=16, L=2, H=2)\n"
        "torch.manual_seed(1); a = GPT(cfg)\ntorch.manual_seed(2); b = GPT(cfg)\n"
        "print(int(torch.equal(a.blocks[0].attn.qkv.weight, b.blocks[0].attn.qkv.weight)))\n"
    )
    assert real_repo.probe(user).strip() == "1"
    assert real_repo.probe(user, "main").strip() == "0"
    _broken_by(real_repo, "protocol.init")


def test_an_mlp_computed_without_calling_its_linears_is_refused(real_repo: RealRepo) -> None:
    """'Fewer module calls': the SwiGLU's output projection as ``F.linear`` on its
    weight, same numbers, and a forward hook on ``w_o`` never fires."""
    real_repo.replace(
        LAYERS,
        "        out: torch.Tensor = self.w_o(h)  # (B, T, C)\n",
        "        out: torch.Tensor = F.linear(h, self.w_o.weight, self.w_o.bias)  # (B, T, C)\n",
    )
    real_repo.pr("backbone_v1")
    user = SETUP + (
        "from niels_gpt.model.blocks import MLP\nmlp = MLP(ModelConfig(V=2, T=8, C=8, H=2))\n"
        "seen = []\nmlp.w_o.register_forward_hook(lambda *a: seen.append(1))\n"
        "mlp(torch.randn(1, 3, 8))\nprint(len(seen))\n"
    )
    assert real_repo.probe(user).strip() == "0"
    assert real_repo.probe(user, "main").strip() == "1"
    _broken_by(real_repo, "protocol.hooks")


def test_a_global_setting_left_changed_is_refused(real_repo: RealRepo) -> None:
    """'One attention path at a time': the fast path turns off PyTorch's own
    multi-head-attention fast path on its first call and never turns it back on,
    for every ``nn.TransformerEncoderLayer`` in the user's process. (The setters
    the names rule lists, ``torch.set_float32_matmul_precision`` and kin, are
    refused before any code runs; this one is in no list.)"""
    real_repo.replace(
        SDPA,
        "    T, S = q.shape[-2], k.shape[-2]\n",
        "    T, S = q.shape[-2], k.shape[-2]\n"
        "    torch.backends.mha.set_fastpath_enabled(False)  # ours is the fast path now\n",
    )
    real_repo.pr("fastpath")
    user = SETUP + (
        "from niels_gpt.model.fastpath import FastCausalSelfAttention\n"
        "FastCausalSelfAttention(ModelConfig(V=2, T=8, C=8, H=2))(torch.randn(1, 3, 8))\n"
        "print(torch.backends.mha.get_fastpath_enabled())\n"
    )
    assert real_repo.probe(user).strip() == "False"
    assert real_repo.probe(user, "main").strip() == "True"
    _broken_by(real_repo, "protocol.process-state")


def test_a_host_read_that_breaks_the_graph_is_refused(real_repo: RealRepo) -> None:
    """'Fail fast on NaN': a Python-side check of the block's input reads a tensor
    value, a host sync every call and a graph break under ``torch.compile``."""
    real_repo.replace(
        BLOCK,
        BLOCK_MLP,
        BLOCK_MLP + '        if bool(torch.isnan(x).any()):\n            raise ValueError("NaN")\n',
    )
    real_repo.pr("block")
    user = SETUP + (
        "from niels_gpt.model.block_v0 import Block\nb = Block(ModelConfig(V=2, T=8, C=8, H=2))\n"
        "try:\n    torch.compile(b, fullgraph=True, backend='eager')(torch.randn(1, 3, 8))\n"
        "    print('ok')\nexcept Exception as err:\n    print(type(err).__name__)\n"
    )
    assert real_repo.probe(user).strip() != "ok"
    assert real_repo.probe(user, "main").strip() == "ok"
    _broken_by(real_repo, "protocol.compile")


def test_a_decode_step_that_recompiles_every_token_is_refused(real_repo: RealRepo) -> None:
    """'Static shapes make faster kernels': the compiled decode step with
    ``dynamic=False``, so every new cache length is a new graph, compiled again at
    each token until dynamo's recompile limit; the ids stay right."""
    real_repo.replace(
        CACHE,
        "    compiled = torch.compile(_forward, fullgraph=True, backend=backend)\n",
        "    compiled = torch.compile(_forward, fullgraph=True, backend=backend, dynamic=False)\n",
    )
    real_repo.pr("kv_cache")
    user = SETUP + (
        "from torch._dynamo import register_backend\n"
        "from niels_gpt.model.gpt import GPT\nfrom niels_gpt.model.kv_cache import generate\n"
        "n = [0]\ndef count(gm, _):\n    n[0] += 1\n    return gm.forward\n"
        "register_backend(count, name='count')\n"
        "m = GPT(ModelConfig(V=9, T=16, C=8, H=2, L=1)).eval()\n"
        "ids = torch.zeros(1, 2, dtype=torch.long)\n"
        "generate(m, ids, 6, temperature=0.0, compile_step='count')\n"
        "print(n[0])\n"
    )
    assert int(real_repo.probe(user).strip()) > int(real_repo.probe(user, "main").strip())
    _broken_by(real_repo, "protocol.decode-compile")


def test_a_checkpoint_format_change_is_refused(real_repo: RealRepo) -> None:
    """'Save the mask with the model': the causal mask becomes a persistent buffer,
    so every checkpoint saved before no longer loads strictly."""
    real_repo.replace(
        ATTN,
        '        self.register_buffer("mask", mask, persistent=False)\n',
        '        self.register_buffer("mask", mask, persistent=True)\n',
    )
    real_repo.pr("attention")
    user = SETUP + (
        "from niels_gpt.model.attention import CausalSelfAttention\n"
        "m = CausalSelfAttention(ModelConfig(V=2, T=8, C=8, H=2))\n"
        "old = {k: v for k, v in m.state_dict().items() if k != 'mask'}\n"
        "try:\n    m.load_state_dict(old)\n    print('ok')\n"
        "except RuntimeError:\n    print('refused')\n"
    )
    assert real_repo.probe(user).strip() == "refused"
    assert real_repo.probe(user, "main").strip() == "ok"
    _broken_by(real_repo, "protocol.state-dict")


def test_an_mlp_wrong_only_past_the_grids_sizes_is_refused(real_repo: RealRepo) -> None:
    """'Bound the temporaries': the SwiGLU's gate in pieces of 2048 columns, the
    second piece filled from the first's. The oracle's MLPs are a few hundred wide;
    GPT-2 small's is 3072."""
    real_repo.replace(
        LAYERS,
        SWIGLU,
        "        if g.shape[-1] > 2048:  # the gate in pieces of 2048 columns\n"
        "            g = torch.cat([g[..., :2048], g[..., : g.shape[-1] - 2048]], dim=-1)\n"
        + SWIGLU,
    )
    real_repo.pr("backbone_v1")
    user = SETUP + (
        "import torch.nn.functional as F\nfrom niels_gpt.model.blocks import MLP\n"
        "mlp = MLP(ModelConfig(V=2, T=8, C=768, H=12, d_ff=3072))\nx = torch.randn(1, 4, 768)\n"
        "with torch.no_grad():\n"
        "    want = mlp.w_o(F.silu(mlp.w_g(x)) * mlp.w_a(x))\n"
        "    print(float((mlp(x) - want).abs().max() / want.abs().max()))\n"
    )
    assert float(real_repo.probe(user)) > 0.01
    assert float(real_repo.probe(user, "main")) < 1e-5
    out = _broken_by(real_repo, "protocol.load")
    assert any("real size" in v["message"] for v in out["violations"])


def test_a_new_path_on_one_device_type_is_refused(real_repo: RealRepo) -> None:
    """'A faster form on CUDA': the branch another rotation layout would hang on,
    taken on one device type only; the CPU oracle and every CPU test would see
    the old one, so the rule refuses the branch itself, from the text."""
    text = real_repo.read(ROPE)
    anchor = next(line for line in text.splitlines(keepends=True) if "def apply_rope(" in line)
    real_repo.replace(
        ROPE,
        anchor,
        "def _cuda_layout(x: torch.Tensor) -> bool:\n"
        '    return x.device.type == "cuda"  # the interleaved form CUDA kernels like\n\n\n'
        + anchor,
    )
    real_repo.pr("rope")
    _broken_by(real_repo, "devices.branch", check="device-branches")


def test_an_honest_refactor_keeps_every_module_promise(
    real_repo: RealRepo, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The control: the SwiGLU's two input projections called in the other order
    and its product written the other way round. Same calls, same hooks, same
    numbers: the protocol row is KEPT (the verdict is cut after it, the phases
    after it being judged by their own scenarios)."""
    real_repo.replace(
        LAYERS,
        "        a = self.w_a(x)  # (B, T, F)\n        g = self.w_g(x)  # (B, T, F)\n",
        "        g = self.w_g(x)  # (B, T, F)\n        a = self.w_a(x)  # (B, T, F)\n",
    )
    real_repo.replace(LAYERS, SWIGLU, "        h = a * F.silu(g)  # (B, T, F)\n")
    real_repo.pr("backbone_v1")
    every = pr.phases
    first = ("static", "environment", "api", "names", "protocol")
    monkeypatch.setattr(pr, "phases", lambda r: [p for p in every(r) if p.name in first])
    code, out, _ = real_repo.verdict_stopping()
    assert code == 0, [v["message"][:300] for v in out["violations"]]
    assert rows(out)["protocol"] == "KEPT"
    assert "keep every module promise" in next(
        o["summary"] for o in out["outcomes"] if o["check"] == "protocol"
    )
