"""Issue 19: Dual Chunk Attention (dca) and PoSE (pose), each against the original's arithmetic re-derived here.

DCA (HKUNLP/ChunkLlama ``chunkllama_attn_replace.py``): the reference is the original's forward re-derived densely:
pre-RoPE q/k/v from the projections, keys rotated with the ``k_t`` table (n mod L), queries with ``q_t`` (m mod L),
``qc_t`` (min(m mod L + L, chunk_size)) and ``qc_t[L - 1]``, the three score blocks picked by (query chunk - key
chunk) = 0 / 1 / >= 2, causal, one plain softmax (what the log-sum-exp merge of the flash parts computes).

PoSE (dwzhu-pku/PoSE ``src/train_pose.py::train_preprocess_function_pose``): the sampling recipe is re-derived here
call by call with a seeded ``random.Random``."""
from __future__ import annotations

import copy
import math
import random
import types
from types import SimpleNamespace

import pytest
import torch

from conftest import random_llama
from harness.config import ConfigError
from harness.methods import METHODS, build_method
from harness.methods.dca import DCA, dca_attention
from harness.models import ModelHandle


def handle_of(model, ctx=64, tok=None):
    return ModelHandle(model, tok, "random", ctx, {})


# ------------------------------------------------------------------------------------------------ DCA reference
def _rope(x, cos, sin):
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat((-x2, x1), -1) * sin


def _table(t, inv):
    f = torch.outer(t.float(), inv.float())
    emb = torch.cat((f, f), -1)
    return emb.cos(), emb.sin()


def original_dca_forward(self, hidden_states, position_embeddings=None, attention_mask=None, past_key_values=None,
                         **kwargs):
    """ChunkLlama's forward, re-derived densely (no cache: every call sees the whole sequence from position 0)."""
    cs, lw = self.ref_dca
    L = cs - lw
    b, n, _ = hidden_states.shape
    D = self.head_dim
    q = self.q_proj(hidden_states).view(b, n, -1, D).transpose(1, 2)
    k = self.k_proj(hidden_states).view(b, n, -1, D).transpose(1, 2)
    v = self.v_proj(hidden_states).view(b, n, -1, D).transpose(1, 2)
    g = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    inv = self.ref_inv
    q_t = torch.arange(L)  # ChunkLlamaRotaryEmbedding._set_cos_sin_cache
    qc_t = (torch.arange(L) + L).clamp(max=cs)
    k_t = torch.arange(n) % L
    pos = torch.arange(n)
    pm = pos % L  # position_ids % chunk_len
    kk = _rope(k, *_table(k_t[pos], inv))
    q_intra = _rope(q, *_table(q_t[pm], inv))
    q_succ = _rope(q, *_table(qc_t[pm], inv))
    q_inter = _rope(q, *_table(qc_t[torch.full_like(pm, L - 1)], inv))
    s_intra, s_succ, s_inter = (x @ kk.transpose(-1, -2) / math.sqrt(D) for x in (q_intra, q_succ, q_inter))
    diff = (pos // L)[:, None] - (pos // L)[None]
    s = torch.where(diff == 0, s_intra, torch.where(diff == 1, s_succ, s_inter))
    causal = pos[:, None] >= pos[None]
    p = torch.softmax(s.masked_fill(~causal, float("-inf")), -1)
    out = (p @ v).transpose(1, 2).reshape(b, n, -1)
    return self.o_proj(out), None


def reference_model(model, cs, lw):
    ref = copy.deepcopy(model)
    inv = ref.model.rotary_emb.inv_freq.detach().clone()
    for layer in ref.model.layers:
        att = layer.self_attn
        att.ref_dca, att.ref_inv = (cs, lw), inv
        att.forward = types.MethodType(original_dca_forward, att)
    return ref


def logits(model, ids, **kw):
    with torch.no_grad():
        return model(input_ids=ids, use_cache=False, **kw).logits


# ------------------------------------------------------------------------------------------------ DCA tests
def test_dca_registered_yaml_and_check():
    from harness.conf_utils import group_defaults

    assert METHODS.get("dca") is DCA
    m = build_method(group_defaults("method", "dca"))
    assert m.name == "dca" and m.check(4096) == (3072, 512)  # the original's LLaMA2-7B values
    assert build_method({"name": "dca", "local_window": 0.0625}).check(4096) == (3072, 256)  # paper-era code
    for bad in ({"chunk_size": 1.0}, {"chunk_size": 0.0}, {"local_window": 0.75}, {"local_window": -0.1},
                {"block_q": 0}):
        with pytest.raises(ConfigError, match="method=dca"):
            build_method({"name": "dca", **bad}).check(4096)


@pytest.mark.parametrize("n", [40, 97, 150])  # chunk length L = 40: intra only; + successive; + inter-chunk
def test_dca_prefill_equals_original_dense(n):
    model = random_llama(kv_heads=2)  # C = 64: chunk_size 48, local_window 8, L = 40
    ids = torch.randint(3, 250, (2, n), generator=torch.Generator().manual_seed(n))
    ref = logits(reference_model(model, 48, 8), ids)
    DCA(DCA.Args(block_q=16, block_k=24)).apply(handle_of(model))
    got = logits(model, ids)
    assert (got - ref).abs().max() <= 1e-5, (got - ref).abs().max()
    if n > 40:
        base = logits(random_llama(kv_heads=2), ids)
        assert (got - base).abs().max() > 1e-3  # the chunked positions are actually used


def test_dca_short_input_equals_unmodified_model():
    model = random_llama(kv_heads=2)
    ids = torch.randint(3, 250, (2, 40))  # = chunk length L: one chunk, intra only
    base = logits(model, ids)
    DCA(DCA.Args(block_q=16, block_k=16)).apply(handle_of(model))
    assert (logits(model, ids) - base).abs().max() <= 1e-5


def test_dca_greedy_decoding_with_kv_cache_equals_original():
    from transformers import DynamicCache

    model = random_llama(kv_heads=2)
    ref = reference_model(model, 48, 8)
    DCA(DCA.Args(block_q=16, block_k=16)).apply(handle_of(model))
    ids = torch.randint(3, 250, (1, 30), generator=torch.Generator().manual_seed(3))
    cache = DynamicCache()
    seq = ids
    with torch.no_grad():
        out = model(input_ids=ids, past_key_values=cache, use_cache=True, position_ids=torch.arange(30)[None])
        for t in range(30, 120):  # crosses chunks 1 and 2 (L = 40): successive and inter parts while decoding
            want = logits(ref, seq)[:, -1]
            got = out.logits[:, -1]
            assert (got - want).abs().max() <= 1e-5, (t, (got - want).abs().max())
            nxt = got.argmax(-1, keepdim=True)
            assert torch.equal(nxt, want.argmax(-1, keepdim=True))
            seq = torch.cat([seq, nxt], 1)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True, position_ids=torch.tensor([[t]]))


def test_dca_flex_backend_refused_with_one_line():
    model = random_llama(kv_heads=2)
    DCA(DCA.Args()).apply(handle_of(model))
    for m in model.modules():
        if hasattr(m, "harness_dca"):
            m.harness_attn_backend = "flex"
    with pytest.raises(ValueError, match="attention.backend=flex is not available for method=dca"):
        logits(model, torch.randint(3, 250, (1, 8)))


def test_dca_mscale_flag_scales_logits_beyond_c():
    L, d = 16, 16
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, L, d, generator=g)
    k = torch.randn(1, 2, L, d, generator=g)
    v = torch.randn(1, 2, L, d, generator=g)
    inv = 1.0 / (10000.0 ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    mod = SimpleNamespace(head_dim=d, training=False, harness_inv_freq=inv)
    mod.harness_dca = (6, 1, False, 4, 8, 8)  # C = 4 < 16 tokens: mscale = 0.05 ln 4 + 1
    off, _ = dca_attention(mod, q, k, v, None, scaling=0.25)
    mod.harness_dca = (6, 1, True, 4, 8, 8)
    on, _ = dca_attention(mod, q, k, v, None, scaling=0.25)
    ms = 0.05 * math.log(16 / 4) + 1
    mod.harness_dca = (6, 1, False, 4, 8, 8)
    want, _ = dca_attention(mod, q, k, v, None, scaling=0.25 * ms * ms)
    assert (on - want).abs().max() <= 1e-6 and (on - off).abs().max() > 1e-4
