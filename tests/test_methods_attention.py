"""Approximate-attention methods (issue 4): Self-Extend, LM-Infinite, Landmark Attention, LongLoRA.

Attention functions are checked against dense references built from *unrotated* q/k with the paper's relative
positions (independent of the re-rotation the implementations use); the whole-model tests use small random Llamas
with grouped KV heads. SmolLM2 tests are marked slow."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from conftest import random_llama

from harness.methods import METHODS, build_method
from harness.methods.landmark import Landmark, grouped_softmax, insert_landmarks, landmark_attention
from harness.methods.lm_infinite import LMInfinite, lm_infinite_attention
from harness.methods.longlora import LongLoRA, s2_attention_heads
from harness.methods.self_extend import SelfExtend, relative_positions, self_extend_attention
from harness.models import ModelHandle

THETA = 10000.0


class LandmarkTok:
    """Stands in for a tokenizer that already has <landmark> (tiny_llama's does)."""

    def __init__(self, mem_id=5):
        self.mem_id = mem_id

    def get_vocab(self):
        return {"<landmark>": self.mem_id}

    def convert_tokens_to_ids(self, t):
        return self.mem_id


def inv_freq(d):
    return 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.float64) / d))


def rot(x, pos, d):
    """Rotate x [..., D] by integer/float positions pos (broadcast to x[..., 0]) in float64, rotate_half layout."""
    ang = torch.as_tensor(pos, dtype=torch.float64)[..., None] * inv_freq(d)
    ang = torch.cat((ang, ang), -1)
    x1, x2 = x.chunk(2, -1)
    return x * ang.cos() + torch.cat((-x2, x1), -1) * ang.sin()


def rotated_inputs(b=1, h=2, n_kv=1, L=40, d=8, seed=0):
    """Random unrotated q0/k0 (float64) and the RoPE-rotated float32 q/k/v an attention function receives."""
    g = torch.Generator().manual_seed(seed)
    q0 = torch.randn(b, h, L, d, generator=g, dtype=torch.float64)
    k0 = torch.randn(b, n_kv, L, d, generator=g, dtype=torch.float64)
    pos = torch.arange(L)
    q = rot(q0, pos, d).float()
    k = rot(k0, pos, d).float()
    return q0, k0, q, k


def module(d, **attrs):
    m = SimpleNamespace(head_dim=d, training=False, harness_inv_freq=inv_freq(d))
    for k_, v_ in attrs.items():
        setattr(m, k_, v_)
    return m


def probs_via_identity(fn, mod, q, k, L, **kw):
    """Attention probabilities of ``fn``: values = identity, so output row i is probability row i."""
    b, n_kv = q.shape[0], k.shape[1]
    v = torch.eye(L).expand(b, n_kv, L, L).contiguous()
    if q.shape[-1] != L:
        raise AssertionError("identity trick needs head_dim == L")
    out, _ = fn(mod, q, k, v, None, scaling=1 / math.sqrt(q.shape[-1]), **kw)
    return out.transpose(1, 2).double()  # [B, H, L, L]


def handle_of(model, ctx=64, tok=None):
    return ModelHandle(model, tok, "random", ctx, {})


def decoder_out(model, ids, **kw):
    with torch.no_grad():
        return model.get_decoder()(input_ids=ids, use_cache=False, **kw).last_hidden_state


# ------------------------------------------------------------------------------------------------ registry / config
def test_registered_and_yaml_defaults_validate():
    from harness.conf_utils import group_defaults

    for name, cls in (("self_extend", SelfExtend), ("lm_infinite", LMInfinite), ("landmark", Landmark),
                      ("longlora", LongLoRA)):
        assert METHODS.get(name) is cls
        m = build_method(group_defaults("method", name))
        assert m.name == name and m.params()["name"] == name
    se = build_method(group_defaults("method", "self_extend"))
    assert se.max_length(SimpleNamespace(native_ctx=256)) == (256 - 64) * 64 + 64 >= 16 * 256


# ------------------------------------------------------------------------------------------------ Self-Extend
def test_self_extend_eq15_positions():
    q = torch.tensor([0, 5, 9, 17])
    k = torch.tensor([0, 3, 8, 16])
    r = relative_positions(q, k, window=4, group=2)
    for i, m in enumerate(q.tolist()):
        for j, n in enumerate(k.tolist()):
            # Eq. 15: M + floor(m/N) - floor(n/N) - floor(M/N)
            want = m - n if m - n < 4 else 4 + m // 2 - n // 2 - 4 // 2
            assert r[i, j].item() == want
    # W % G != 0: the eager prefill code's W - W/G (flag) differs from Eq. 15's W - W//G by the fraction
    a = relative_positions(q, k, 5, 2, float_shift=False)
    b = relative_positions(q, k, 5, 2, float_shift=True)
    far = (q[:, None] - k[None]) >= 5
    assert torch.allclose((b - a)[far], torch.full_like((b - a)[far], -0.5))  # 5 - 5/2 vs 5 - 5//2


@pytest.mark.parametrize("window,group,float_shift", [(8, 4, False), (6, 4, True)])
def test_self_extend_attention_matches_dense_eq15(window, group, float_shift):
    L, d = 40, 40
    q0, k0, q, k = rotated_inputs(b=2, h=4, n_kv=2, L=L, d=d)
    mod = module(d, harness_self_extend=(window, group, float_shift, 16, 8))
    p = probs_via_identity(self_extend_attention, mod, q, k, L, position_ids=torch.arange(L)[None])
    pos = torch.arange(L)
    r = relative_positions(pos, pos, window, group, float_shift)  # [L, L]
    kx = k0.repeat_interleave(2, dim=1)
    logits = torch.einsum("bhid,bhijd->bhij", q0, rot(kx[:, :, None].expand(-1, -1, L, -1, -1), -r, d)) / math.sqrt(d)
    logits = logits.masked_fill(~torch.ones(L, L, dtype=torch.bool).tril(), float("-inf"))
    ref = torch.softmax(logits, -1)
    assert torch.allclose(p, ref, atol=2e-5), (p - ref).abs().max()


def test_self_extend_equals_plain_attention_within_window_and_decode_matches():
    model = random_llama(kv_heads=2)
    ids = torch.randint(3, 250, (2, 48))
    ref = decoder_out(model, ids)
    SelfExtend(SelfExtend.Args(window=0.5, group=4, block_q=16, block_k=16)).apply(handle_of(model, ctx=128))  # W 64
    assert (decoder_out(model, ids) - ref).abs().max() <= 1e-5
    SelfExtend(SelfExtend.Args(window=0.125, group=4, block_q=16, block_k=16)).apply(handle_of(model))  # W = C/8 = 8
    full = decoder_out(model, ids)
    assert (full - ref).abs().max() > 1e-3  # grouped attention is actually used
    from transformers import DynamicCache

    cache, outs = DynamicCache(), []
    with torch.no_grad():
        outs.append(model.get_decoder()(input_ids=ids[:, :20], past_key_values=cache, use_cache=True,
                                        position_ids=torch.arange(20)[None]).last_hidden_state)
        for t in range(20, 48):
            outs.append(model.get_decoder()(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True,
                                            position_ids=torch.tensor([[t]])).last_hidden_state)
    assert (torch.cat(outs, 1) - full).abs().max() <= 1e-5


# ------------------------------------------------------------------------------------------------ LM-Infinite
def test_lm_infinite_lambda_mask_and_clipped_distance():
    L, d, n_global, n_local = 40, 40, 3, 8
    q0, k0, q, k = rotated_inputs(b=1, h=4, n_kv=2, L=L, d=d, seed=1)
    mod = module(d, harness_lm_infinite=(n_global, n_local, n_local, 16, 8))
    p = probs_via_identity(lm_infinite_attention, mod, q, k, L, position_ids=torch.arange(L)[None])
    i, j = torch.arange(L)[:, None], torch.arange(L)[None]
    local = (i - j >= 0) & (i - j < n_local)
    glob = (j < n_global) & (i - j >= n_local)
    middle = (j >= n_global) & (i - j >= n_local)
    assert bool((p[..., middle] == 0).all())  # exactly zero weight, not just small
    kx = k0.repeat_interleave(2, dim=1)
    rel = torch.where(glob, torch.full_like(i - j, n_local), i - j)  # far global tokens: distance clipped to d*
    logits = torch.einsum("bhid,bhijd->bhij", q0, rot(kx[:, :, None].expand(-1, -1, L, -1, -1), -rel, d)) / math.sqrt(d)
    ref = torch.softmax(logits.masked_fill(~(local | glob), float("-inf")), -1)
    assert torch.allclose(p, ref, atol=2e-5), (p - ref).abs().max()


def test_lm_infinite_equals_plain_attention_within_window():
    model = random_llama(kv_heads=2)
    ids = torch.randint(3, 250, (2, 48))
    ref = decoder_out(model, ids)
    LMInfinite(LMInfinite.Args(n_global=4, n_local=1, block_q=16, block_k=16)).apply(handle_of(model, ctx=64))
    assert (decoder_out(model, ids) - ref).abs().max() <= 1e-5


# ------------------------------------------------------------------------------------------------ padding (SE, LMI)
@pytest.mark.parametrize("method", [SelfExtend(SelfExtend.Args(window=0.125, group=4, block_q=8, block_k=8)),
                                    LMInfinite(LMInfinite.Args(n_global=3, n_local=0.125, block_q=8, block_k=8))])
def test_batch_with_right_and_left_padding(method):
    model = random_llama(kv_heads=2)
    method.apply(handle_of(model))
    short = torch.randint(3, 250, (1, 21))
    long = torch.randint(3, 250, (1, 30))
    alone_s, alone_l = decoder_out(model, short), decoder_out(model, long)
    pad = torch.zeros(1, 9, dtype=torch.long)
    # right padding
    ids = torch.cat([long, torch.cat([short, pad], 1)])
    am = torch.ones(2, 30, dtype=torch.long)
    am[1, 21:] = 0
    out = decoder_out(model, ids, attention_mask=am)
    assert (out[0] - alone_l[0]).abs().max() <= 1e-5
    assert (out[1, :21] - alone_s[0]).abs().max() <= 1e-5
    # left padding with padding-aware position ids (as generate() builds them)
    ids = torch.cat([long, torch.cat([pad, short], 1)])
    am = torch.ones(2, 30, dtype=torch.long)
    am[1, :9] = 0
    pos = (am.cumsum(-1) - 1).clamp_min(0)
    out = decoder_out(model, ids, attention_mask=am, position_ids=pos)
    assert (out[0] - alone_l[0]).abs().max() <= 1e-5
    assert (out[1, 9:] - alone_s[0]).abs().max() <= 1e-5


# ------------------------------------------------------------------------------------------------ Landmark
def reference_grouped_probs(s, is_mem, blk, q_pos):
    """The two-level formula, by loops: s [K] scores of one query at index q_pos over keys 0..q_pos."""
    K = q_pos + 1
    bq = blk[q_pos]
    top = [j for j in range(K) if (blk[j] == bq and not is_mem[j]) or (is_mem[j] and blk[j] != bq)]
    z = sum(math.exp(s[j]) for j in top)
    p = [0.0] * len(s)
    for j in range(K):
        if is_mem[j]:
            continue
        if blk[j] == bq:
            p[j] = math.exp(s[j]) / z
        else:
            members = [t for t in range(K) if blk[t] == blk[j] and not is_mem[t]]
            lm = [t for t in range(K) if blk[t] == blk[j] and is_mem[t]][0]
            p[j] = math.exp(s[j]) / sum(math.exp(s[t]) for t in members) * math.exp(s[lm]) / z
    return p


def test_landmark_grouped_softmax_equals_two_level_formula():
    torch.manual_seed(0)
    mem_freq, L = 3, 15
    ids, keep = insert_landmarks(torch.arange(10, 10 + 12)[None], mem_freq, 5, trailing=False)
    is_mem = ids[0] == 5
    blk = torch.cumsum(is_mem.long(), 0) - is_mem.long()
    assert ids.shape[1] == L and is_mem.tolist() == [False] * 3 + [True] + [False] * 3 + [True] + [False] * 3 + \
        [True] + [False] * 3
    s = torch.randn(L, L, dtype=torch.float64)
    vis = torch.ones(L, L, dtype=torch.bool).tril()
    same = blk[:, None] == blk[None]
    p = grouped_softmax(s, vis, is_mem[None], same, blk[None], int(blk.max()) + 1)
    for i in range(L):
        ref = reference_grouped_probs(s[i].tolist(), is_mem.tolist(), blk.tolist(), i)
        assert torch.allclose(p[i], torch.tensor(ref, dtype=torch.float64), atol=1e-12)
        assert abs(p[i].sum().item() - 1) < 1e-12
        assert bool((p[i][is_mem] == 0).all())  # landmarks only gate


def test_landmark_attention_function_probabilities():
    L, d, mem_freq = 24, 24, 5
    _, _, q, k = rotated_inputs(b=1, h=4, n_kv=2, L=L, d=d, seed=2)
    stream, _ = insert_landmarks(torch.arange(30, 30 + 20)[None], mem_freq, 5)  # ends with a landmark query
    assert stream.shape[1] == L
    is_mem = stream == 5
    mod = module(d, harness_landmark=(mem_freq, 0, 7))
    p = probs_via_identity(landmark_attention, mod, q, k, L, landmark_is_mem=is_mem)
    s = torch.matmul(q.double(), k.double().repeat_interleave(2, 1).transpose(-1, -2)) / math.sqrt(d)
    blk = (torch.cumsum(is_mem[0].long(), 0) - is_mem[0].long()).tolist()
    for h in range(4):
        for i in range(L):
            ref = reference_grouped_probs(s[0, h, i].tolist(), is_mem[0].tolist(), blk, i)
            assert torch.allclose(p[0, h, i], torch.tensor(ref, dtype=torch.float64), atol=2e-5)
    assert torch.allclose(p.sum(-1), torch.ones(1, 4, L, dtype=torch.float64), atol=1e-5)


def test_landmark_insertion_every_block_and_stripped_outputs():
    model = random_llama(kv_heads=2)
    tok = LandmarkTok(5)
    meth = Landmark(Landmark.Args(mem_freq=7, train_len=32, top_k=2, q_block=16))
    meth.apply(handle_of(model, tok=tok))
    batch = meth.train_batch(torch.randint(6, 250, (1, 64)))  # 64 -> 2 x 32, a landmark after every 7 tokens
    ids = batch["input_ids"]
    assert ids.shape == (2, 32 + 4)
    assert (ids == 5).nonzero()[:, 1].tolist() == [7, 15, 23, 31] * 2
    assert torch.equal(batch["labels"], ids)
    # the decoder inserts them itself in eval mode and returns the original tokens only
    x = torch.randint(6, 250, (1, 30))
    out = decoder_out(model, x)
    assert out.shape == (1, 30, 64)
    stream, keep = insert_landmarks(x, 7, 5)
    dec = model.get_decoder()
    dec.harness_landmark_state["auto_insert"] = False  # plain pass over the inserted stream (no chunking)
    with torch.no_grad():
        full = dec(input_ids=stream).last_hidden_state
    dec.harness_landmark_state["auto_insert"] = True
    # chunks 1-3 retrieve every earlier block (top_k=2 >= blocks so far): the same as one plain pass
    assert (full[:, keep][:, :16] - out[:, :16]).abs().max() <= 1e-5


def test_landmark_retrieval_of_all_blocks_equals_full_grouped_softmax_and_training_step():
    from transformers import DynamicCache

    model = random_llama(kv_heads=2)
    tok = LandmarkTok(5)
    x = torch.randint(6, 250, (1, 40))
    Landmark(Landmark.Args(mem_freq=7, top_k=0, q_block=16)).apply(handle_of(model, tok=tok))
    ref = decoder_out(model, x)
    # retrieving every block (top_k >= blocks) puts each block at its true position: same as no retrieval
    meth = Landmark(Landmark.Args(mem_freq=7, train_len=512, top_k=60, q_block=16))
    meth.apply(handle_of(model, tok=tok))
    assert (decoder_out(model, x) - ref).abs().max() <= 1e-5
    cache, outs = DynamicCache(), []
    with torch.no_grad():
        outs.append(model.get_decoder()(input_ids=x[:, :20], past_key_values=cache, use_cache=True,
                                        position_ids=torch.arange(20)[None]).last_hidden_state)
        for t in range(20, 40):
            outs.append(model.get_decoder()(input_ids=x[:, t:t + 1], past_key_values=cache, use_cache=True,
                                            position_ids=torch.tensor([[t]])).last_hidden_state)
    assert (torch.cat(outs, 1) - ref).abs().max() <= 1e-5
    assert cache.get_seq_length() == 40 + 40 // 7
    # real retrieval (top-2 of 5 blocks) differs, and a training step runs with gradients on the landmark row
    Landmark(Landmark.Args(mem_freq=7, train_len=40, top_k=2, q_block=16)).apply(handle_of(model, tok=tok))
    assert (decoder_out(model, x) - ref).abs().max() > 1e-4
    meth.train_mode(handle_of(model))
    model.train()
    loss = model(**meth.train_batch(torch.randint(6, 250, (1, 64)))).loss
    loss.backward()
    assert math.isfinite(loss.item()) and model.model.embed_tokens.weight.grad[5].abs().sum() > 0
    model.eval()


def naive_landmark_retrieval(q, k, v, is_mem_new, scale, mem_freq, top_k):
    """run_test.py / llama_mem.py's retrieval, one query and one head at a time: landmark keys at their synthetic
    positions, top-k blocks by q . landmark key, each retrieved block's keys re-rotated to its slot before the
    current block, then the grouped softmax over [retrieved blocks, incomplete block of the cache + chunk]."""
    _, h, lq, d = q.shape
    kv, g, block = k.shape[2], h // k.shape[1], mem_freq + 1
    past = kv - lq
    full = past - past % block
    nm = full // block
    top = min(top_k, nm)
    prefix_len = full - (top + 1) * block
    is_mem_main = torch.cat([torch.zeros(kv - full - lq, dtype=torch.bool), is_mem_new])
    blk_main = torch.cumsum(is_mem_main.long(), 0) - is_mem_main.long() + top
    out = torch.zeros(1, h, lq, d, dtype=torch.float64)
    for hh in range(h):
        kh, vh = k[0, hh // g].double(), v[0, hh // g].double()
        for i in range(lq):
            qi = q[0, hh, i].double()
            lm = []
            for j in range(nm):
                slot = j - (nm - top) + 1 if j >= nm - top else 0
                idx = j * block + mem_freq
                lm.append(float(qi @ rot(kh[idx], prefix_len + mem_freq + block * slot - idx, d)))
            sel = sorted(torch.tensor(lm).topk(top).indices.tolist())
            s, mem, same, bucket, vals = [], [], [], [], []
            for r, j in enumerate(sel):
                delta = prefix_len + r * block + (block if j >= nm - top else 0) - j * block
                for t in range(block):
                    s.append(float(qi @ rot(kh[j * block + t], delta, d)) * scale)
                    mem.append(t == mem_freq), same.append(False), bucket.append(r), vals.append(vh[j * block + t])
            qm = kv - full - lq + i
            for m in range(qm + 1):
                s.append(float(qi @ kh[full + m]) * scale)
                mem.append(bool(is_mem_main[m])), same.append(bool(blk_main[m] == blk_main[qm]))
                bucket.append(int(blk_main[m])), vals.append(vh[full + m])
            n = len(s)
            p = grouped_softmax(torch.tensor(s, dtype=torch.float64), torch.ones(n, dtype=torch.bool),
                                torch.tensor(mem), torch.tensor(same), torch.tensor(bucket), max(bucket) + 1)
            out[0, hh, i] = p @ torch.stack(vals)
    return out


@pytest.mark.parametrize("past,lq,top_k", [(43, 10, 2), (40, 1, 3), (61, 7, 9)])
def test_landmark_retrieval_equals_one_query_at_a_time(past, lq, top_k):
    """The vectorised retrieval (per query and head: top-k blocks, re-rotation to synthetic slots, grouped softmax)
    equals the original's arithmetic written one query and one head at a time, with grouped KV heads, a chunk that
    starts inside a block, single-token decoding, and top_k above the number of complete blocks."""
    from harness.methods.landmark import _retrieval

    mem_freq, d, h, n_kv = 7, 8, 4, 2
    kv = past + lq
    g = torch.Generator().manual_seed(past)
    q = torch.randn(1, h, lq, d, generator=g)
    k = torch.randn(1, n_kv, kv, d, generator=g)
    v = torch.randn(1, n_kv, kv, d, generator=g)
    is_mem_new = (torch.arange(past, kv) % (mem_freq + 1)) == mem_freq
    valid = torch.ones(1, kv, dtype=torch.bool)
    got = _retrieval(q, k, v, is_mem_new[None], valid, 0.35, 4, mem_freq, top_k, inv_freq(d))
    want = naive_landmark_retrieval(q, k, v, is_mem_new, 0.35, mem_freq, top_k)
    assert (got.double() - want).abs().max() <= 1e-5


def test_landmark_right_padding():
    model = random_llama(kv_heads=2)
    Landmark(Landmark.Args(mem_freq=7, train_len=48, top_k=1, q_block=16)).apply(handle_of(model, tok=LandmarkTok()))
    short, long = torch.randint(6, 250, (1, 25)), torch.randint(6, 250, (1, 40))
    ids = torch.cat([long, torch.cat([short, torch.zeros(1, 15, dtype=torch.long)], 1)])
    am = torch.ones(2, 40, dtype=torch.long)
    am[1, 25:] = 0
    out = decoder_out(model, ids, attention_mask=am)
    assert (out[0] - decoder_out(model, long)[0]).abs().max() <= 1e-5
    assert (out[1, :25] - decoder_out(model, short)[0]).abs().max() <= 1e-5


# ------------------------------------------------------------------------------------------------ LongLoRA
def test_s2_attn_group_structure_and_leakage():
    torch.manual_seed(0)
    b, h, n, d, G = 1, 4, 16, 8, 4
    q, k, v = (torch.randn(b, h, n, d) for _ in range(3))
    valid = torch.ones(b, n, dtype=torch.bool)
    base = s2_attention_heads(q, k, v, valid, G, True, "flash", 1 / math.sqrt(d))
    for t in range(n):  # perturb token t's key/value: who changes?
        k2, v2 = k.clone(), v.clone()
        k2[:, :, t] += 1.0
        v2[:, :, t] += 1.0
        out = s2_attention_heads(q, k2, v2, valid, G, True, "flash", 1 / math.sqrt(d))
        changed = (out - base).abs().amax(dim=(0, 3)) > 0  # [H, n]
        for i in range(n):
            same_group = i // G == t // G
            same_shift = (i + G // 2) // G == (t + G // 2) // G  # segments [0,2), [2,6), ..., [14,16)
            assert bool(changed[:2, i].any()) == (same_group and i >= t)  # unshifted half: causal within groups
            assert bool(changed[2:, i].any()) == (same_shift and i >= t)  # shifted half: no wrap-around
    # the non-flash roll reproduces the original's wrap-around leakage: token 0 sees the last tokens
    rolled = s2_attention_heads(q, k, v, valid, G, True, "roll", 1 / math.sqrt(d))
    v2 = v.clone()
    v2[:, :, n - 1] += 1.0
    leak = s2_attention_heads(q, k, v2, valid, G, True, "roll", 1 / math.sqrt(d)) - rolled
    assert leak[:, 2:, 0].abs().max() > 0


def test_s2_attn_one_group_is_full_attention_and_padding():
    model = random_llama(kv_heads=2)
    ids = torch.randint(3, 250, (2, 32))
    with torch.no_grad():
        ref = model(input_ids=ids).logits
    meth = LongLoRA(LongLoRA.Args(scale=1.0, group_size_ratio=1.0, shift=False))
    h = handle_of(model)
    meth.apply(h)
    meth.train_mode(h)
    model.train()
    with torch.no_grad():
        assert (model(input_ids=ids).logits - ref).abs().max() <= 1e-5
        # batch with right padding, real S2 groups: the padded row equals its unpadded run
        for m in model.modules():
            if hasattr(m, "harness_longlora"):
                m.harness_longlora = (0.25, True, "flash")
        am = torch.ones(2, 32, dtype=torch.long)
        am[1, 24:] = 0
        out = model(input_ids=ids, attention_mask=am).logits
        alone = model(input_ids=ids[1:]).logits
        assert (out[1, :16] - alone[0, :16]).abs().max() <= 1e-4  # groups [0,8),[8,16): no padded key inside
    model.eval()


def test_longlora_trainable_set_pi_and_merge():
    model = random_llama(kv_heads=2)
    fresh_keys = set(model.state_dict())
    h = handle_of(model)
    meth = LongLoRA(LongLoRA.Args())
    meth.apply(h)
    assert model.config.rope_parameters["rope_type"] == "linear" and model.config.rope_parameters["factor"] == 8.0
    meth.train_mode(h)
    names = LongLoRA.trainable_names(model)
    lora = [n for n in names if "lora_" in n]
    assert len(lora) == 2 * 4 * 2  # A and B for q,k,v,o in 2 layers
    assert sorted(set(names) - set(lora)) == sorted(n for n in fresh_keys if "embed" in n or "norm" in n)
    assert not any("lm_head" in n for n in names)
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.05)
    model.eval()
    model.set_attn_implementation("sdpa")
    ids = torch.randint(3, 250, (1, 24))
    with torch.no_grad():
        with_lora = model(input_ids=ids).logits
    meth.eval_mode(h)
    assert set(model.state_dict()) == fresh_keys  # merged: the base architecture again
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert (model(input_ids=ids).logits - with_lora).abs().max() <= 1e-4


# ------------------------------------------------------------------------------------------------ SmolLM2 (GQA 9/3)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["self_extend", "lm_infinite", "landmark", "longlora"])
def test_smollm2_runs(name):
    from harness.conf_utils import group_defaults
    from harness.models import load_model

    handle = load_model("smollm2_135m")
    ids = handle.tokenizer("The grass is green. " * 20, return_tensors="pt").input_ids[:, :96]
    ref = decoder_out(handle.model, ids)
    node = group_defaults("method", name)
    if name == "self_extend":
        node.update(window=32 / 8192, group=4)  # 32 tokens (lengths are multiples of C = 8192)
    if name == "lm_infinite":
        node.update(n_local=32 / 8192)
    meth = build_method(node)
    meth.apply(handle)
    out = decoder_out(handle.model, ids)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    if name in ("self_extend", "lm_infinite"):
        node.update(window=0.5) if name == "self_extend" else node.update(n_local=0.5)  # 4096 tokens
        build_method(node).apply(handle)
        assert (decoder_out(handle.model, ids) - ref).abs().max() <= 1e-4


def test_landmark_resync_crops_a_cache_that_holds_more_than_the_caller_keeps():
    """``PrefixCache`` crops by original-token counts and passkey prompts share a prefix: the landmark decoder then
    continues from a position before the cache end and must crop the stream back to whole original tokens (the study's
    Landmark row failed here: transformers 5's ``crop`` takes a negative count, not a length)."""
    from transformers import DynamicCache

    from harness.methods.landmark import _resync, stream_length

    mem_freq, n_orig = 7, 30
    held = stream_length(n_orig, mem_freq)              # 30 tokens + 4 landmarks
    cache = DynamicCache()
    cache.update(torch.randn(1, 2, held, 4), torch.randn(1, 2, held, 4), 0)
    cache.harness_landmark_ids = torch.arange(100, 100 + n_orig)[None]
    new = torch.tensor([[7, 8]])
    feed, m, before = _resync(cache, new, torch.tensor([[20, 21]]), mem_freq)   # continue after 20 original tokens
    assert m == 20 and before == stream_length(20, mem_freq) == cache.get_seq_length()
    assert feed.tolist() == [[7, 8]]
    feed, m, before = _resync(cache, new, torch.tensor([[25, 26]]), mem_freq)   # 5 original tokens fed again
    assert m == 20 and feed.tolist() == [list(range(120, 125)) + [7, 8]]
