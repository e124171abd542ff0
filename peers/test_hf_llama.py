"""A peer nobody here wrote: our GPT's weights in Hugging Face's ``LlamaForCausalLM``.

Our v1 GPT is a Llama: pre-norm RMSNorm blocks, rotary attention without
biases, a SwiGLU MLP, a final RMSNorm, the head tied to the embedding. With
``num_key_value_heads < num_attention_heads`` HF's attention repeats each
key/value head for its group (``repeat_kv``), the definition our
grouped-query attention is held to. The mapping, name by name:

- ``tok_emb`` -> ``embed_tokens`` (``lm_head`` tied: ``tie_word_embeddings``);
- ``ln1``/``ln2``/``ln_f`` -> ``input_layernorm``/``post_attention_layernorm``/
  ``norm``, ``eps = 1e-5`` (``rms_norm_eps``);
- ``qkv`` (rows ``q | k | v`` of ``C``, ``H_kv D``, ``H_kv D``) ->
  ``q_proj``, ``k_proj``, ``v_proj``, no biases (``attention_bias=False``);
  ``proj`` -> ``o_proj``;
- RoPE: ours turns interleaved channel pairs ``(2i, 2i+1)``, HF's the halves
  ``(i, i + D/2)`` (``rotate_half``), at the same frequencies
  ``theta^(-2i/D)``; so each head's rows of ``q_proj`` and ``k_proj`` are
  permuted as HF's Llama conversion script does (pair ``i``'s two rows go to
  rows ``i`` and ``i + D/2``), which makes the scores equal;
- SwiGLU ``w_o(silu(w_g x) * w_a x)`` with biases -> ``down_proj(silu(gate_proj
  x) * up_proj x)``: ``w_g`` -> ``gate_proj``, ``w_a`` -> ``up_proj``, ``w_o`` ->
  ``down_proj``, ``mlp_bias=True``.

Two differences are of precision, not of structure, and cannot be mapped by
weights: HF's ``LlamaRMSNorm`` computes in float32 whatever the input's dtype
(``hidden_states.to(torch.float32)``), and HF's rotary tables are float32
angles ``position * inv_freq`` while ours are the float64 angles' sines and
cosines rounded once to float32. So the float64 comparison to round-off
(``test_logits_and_greedy_generation_in_float64``) gives HF's norm its own
formula in the input's dtype and HF's attention our tables (the same table
values for both; HF's rotation, projections, ``repeat_kv`` or SDPA, softmax,
MLP, cache and generation loop are its own); ``test_hf_as_shipped`` compares
with HF untouched, to float32's bound.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama import modeling_llama

from niels_gpt.config import ModelConfig
from niels_gpt.model.gpt import GPT
from niels_gpt.model.kv_cache import generate

CFG = ModelConfig(V=97, T=64, C=64, L=3, H=8, d_ff=96, dropout=0.0, rope_theta=500.0)  # D = 8
H_KV = [1, 2, 8]  # multi-query, groups of 4, multi-head (the control)


def _ours(h_kv: int, dtype: torch.dtype) -> GPT:
    torch.manual_seed(h_kv)
    model = GPT(dataclasses.replace(CFG, H_kv=h_kv)).to(dtype).eval()
    with torch.no_grad():  # norms away from 1 and non-zero biases, so a swap shows
        for name, p in model.named_parameters():
            if name.endswith(("ln1.weight", "ln2.weight", "ln_f.weight")) or ".bias" in name:
                noise = torch.randn_like(p)  # the parameter's shape
                p.copy_(1 + 0.3 * noise if "ln" in name else 0.1 * noise)
    return model


def _halves(w: torch.Tensor, heads: int) -> torch.Tensor:
    """Rows of ``(heads * D, C)`` from interleaved pairs to halves, head by head."""
    d, c = w.shape[0] // heads, w.shape[1]
    return w.view(heads, d // 2, 2, c).transpose(1, 2).reshape(heads * d, c)  # (heads * D, C)


def _peer(ours: GPT) -> LlamaForCausalLM:
    cfg = ours.cfg
    hf_cfg = LlamaConfig(
        vocab_size=cfg.V, hidden_size=cfg.C, intermediate_size=cfg.d_ff,
        num_hidden_layers=cfg.L, num_attention_heads=cfg.H, num_key_value_heads=cfg.kv_heads,
        head_dim=cfg.head_dim, max_position_embeddings=cfg.T, rms_norm_eps=1e-5,
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        attention_bias=False, mlp_bias=True, tie_word_embeddings=True, hidden_act="silu",
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
    )  # fmt: skip
    peer = LlamaForCausalLM._from_config(hf_cfg, attn_implementation="sdpa")
    peer = peer.to(ours.tok_emb.weight.dtype).eval()
    c, kv = cfg.C, cfg.kv_heads * cfg.head_dim
    ws: dict[str, torch.Tensor] = {
        "model.embed_tokens.weight": ours.tok_emb.weight,
        "model.norm.weight": ours.ln_f.weight,
    }
    for i, block in enumerate(ours.blocks):
        wq, wk, wv = torch.split(block.attn.qkv.weight, [c, kv, kv])  # (C, C), (kv, C) x2
        at = f"model.layers.{i}."
        ws |= {
            at + "input_layernorm.weight": block.ln1.weight,
            at + "post_attention_layernorm.weight": block.ln2.weight,
            at + "self_attn.q_proj.weight": _halves(wq, cfg.H),
            at + "self_attn.k_proj.weight": _halves(wk, cfg.kv_heads),
            at + "self_attn.v_proj.weight": wv,
            at + "self_attn.o_proj.weight": block.attn.proj.weight,
        }
        for theirs, mine in (("gate_proj", "w_g"), ("up_proj", "w_a"), ("down_proj", "w_o")):
            layer = getattr(block.mlp, mine)
            ws |= {at + f"mlp.{theirs}.weight": layer.weight, at + f"mlp.{theirs}.bias": layer.bias}
    missing, unexpected = peer.load_state_dict({k: v.detach() for k, v in ws.items()}, strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}  # the tied head
    assert peer.lm_head.weight.data_ptr() == peer.model.embed_tokens.weight.data_ptr()
    return peer


class _OurTables(nn.Module):
    """HF's rotary module's interface, giving our tables: ``(cos, sin)`` ``(B, T, D)``."""

    def __init__(self, ours: GPT) -> None:
        super().__init__()
        attn = ours.blocks[0].attn
        self.sin, self.cos = attn.rope_sin[0, 0], attn.rope_cos[0, 0]  # (cfg.T, D/2) each

    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, ...]:
        cos, sin = self.cos[position_ids], self.sin[position_ids]  # (B, T, D/2) each
        return torch.cat((cos, cos), -1).to(x.dtype), torch.cat((sin, sin), -1).to(x.dtype)


def _norm_in_input_dtype(self: Any, hidden_states: torch.Tensor) -> torch.Tensor:
    """HF's RMSNorm formula, ``w * x * rsqrt(mean(x^2) + eps)``, in the input's dtype."""
    variance = hidden_states.pow(2).mean(-1, keepdim=True)  # (B, T, 1)
    normed = hidden_states * torch.rsqrt(variance + self.variance_epsilon)  # (B, T, C)
    out: torch.Tensor = self.weight * normed  # (B, T, C)
    return out


def _hf_greedy(peer: LlamaForCausalLM, prompt: torch.Tensor, n: int) -> torch.Tensor:
    out: torch.Tensor = peer.generate(
        prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=n, min_new_tokens=n,
        do_sample=False, use_cache=True, pad_token_id=0,
    )  # fmt: skip
    return out  # (B, t + n)


@pytest.mark.parametrize("h_kv", H_KV)
def test_logits_and_greedy_generation_in_float64(
    h_kv: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(modeling_llama.LlamaRMSNorm, "forward", _norm_in_input_dtype)
    ours = _ours(h_kv, torch.float64)
    peer = _peer(ours)
    assert peer.config.num_key_value_heads == h_kv < CFG.H or h_kv == CFG.H
    peer.model.rotary_emb = _OurTables(ours)
    ids = torch.randint(0, CFG.V, (3, 40), generator=torch.Generator().manual_seed(h_kv))
    with torch.no_grad():
        want = ours(ids)  # (3, 40, V)
        got = peer(ids).logits  # (3, 40, V)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    prompt = ids[:, :5]  # (3, 5)
    with torch.no_grad():
        theirs = _hf_greedy(peer, prompt, CFG.T - 5)  # (3, T): HF's DynamicCache
    mine = generate(ours, prompt, CFG.T - 5, temperature=0.0)  # (3, T): our KV cache
    assert torch.equal(mine, theirs)


@pytest.mark.parametrize("h_kv", H_KV)
def test_hf_as_shipped(h_kv: int) -> None:
    """HF untouched (float32 norms and rotary angles): float32's bound, and greedy tokens."""
    ours = _ours(h_kv, torch.float32)
    peer = _peer(ours)
    ids = torch.randint(0, CFG.V, (2, 48), generator=torch.Generator().manual_seed(10 + h_kv))
    with torch.no_grad():
        want, got = ours(ids), peer(ids).logits  # (2, 48, V) each
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        prompt = ids[:, :6]  # (2, 6)
        theirs = _hf_greedy(peer, prompt, 20)  # (2, 26)
    assert torch.equal(generate(ours, prompt, 20, temperature=0.0), theirs)
