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
        for t in range(30, 95):  # crosses chunks 1 and 2 (L = 40): successive and inter parts while decoding
            want = logits(ref, seq)[:, -1]
            got = out.logits[:, -1]
            assert (got - want).abs().max() <= 1e-5, (t, (got - want).abs().max())
            nxt = got.argmax(-1, keepdim=True)
            assert torch.equal(nxt, want.argmax(-1, keepdim=True))
            seq = torch.cat([seq, nxt], 1)
            out = model(input_ids=nxt, past_key_values=cache, use_cache=True, position_ids=torch.tensor([[t]]))
        gen = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=seq.shape[1] - 30,
                             do_sample=False, pad_token_id=0)
    assert torch.equal(gen, seq)  # transformers' generate (its own cache and positions): the same greedy tokens


def test_dca_batch_with_right_and_left_padding():
    model = random_llama(kv_heads=2)
    DCA(DCA.Args(block_q=16, block_k=16)).apply(handle_of(model))  # L = 40
    g = torch.Generator().manual_seed(5)
    short, long = torch.randint(3, 250, (1, 70), generator=g), torch.randint(3, 250, (1, 95), generator=g)
    alone_s, alone_l = logits(model, short), logits(model, long)
    pad = torch.zeros(1, 25, dtype=torch.long)
    ids = torch.cat([long, torch.cat([short, pad], 1)])  # right padding
    am = torch.ones(2, 95, dtype=torch.long)
    am[1, 70:] = 0
    out = logits(model, ids, attention_mask=am)
    assert (out[0] - alone_l[0]).abs().max() <= 1e-5 and (out[1, :70] - alone_s[0]).abs().max() <= 1e-5
    ids = torch.cat([long, torch.cat([pad, short], 1)])  # left padding, padding-aware positions (as generate)
    am = torch.ones(2, 95, dtype=torch.long)
    am[1, :25] = 0
    out = logits(model, ids, attention_mask=am, position_ids=(am.cumsum(-1) - 1).clamp_min(0))
    assert (out[0] - alone_l[0]).abs().max() <= 1e-5 and (out[1, 25:] - alone_s[0]).abs().max() <= 1e-5


def test_dca_flex_backend_equals_reference_prefill_and_decode():
    from transformers import DynamicCache

    from harness.methods import flex as fx

    ids = torch.randint(3, 250, (2, 130), generator=torch.Generator().manual_seed(9))
    am = torch.ones(2, 130, dtype=torch.long)
    am[1, 110:] = 0  # right padding in row 1
    res = {}
    for backend in ("reference", "flex"):
        model = random_llama(kv_heads=2)
        fx.set_backend(model, backend)
        DCA(DCA.Args(block_q=16, block_k=16)).apply(handle_of(model))  # L = 40: intra, successive, inter
        with torch.no_grad():
            full = model(input_ids=ids, attention_mask=am).logits
            cache = DynamicCache(config=model.config)
            steps = [model(input_ids=ids[:, :75], past_key_values=cache, use_cache=True).logits[:, -1]]
            for t in range(75, 85):  # crosses the chunk boundary at 80
                steps.append(model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
        res[backend] = (full, torch.stack(steps))
    (fr, dr), (ff, df) = res["reference"], res["flex"]
    assert (ff[0] - fr[0]).abs().max() <= 1e-5 and (ff[1, :110] - fr[1, :110]).abs().max() <= 1e-5
    assert (df - dr).abs().max() <= 1e-5
    assert (dr[1:, 0] - fr[0, 75:85]).abs().max() <= 1e-5  # decoding with the cache = prefill (row 0: no padding)


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


# ------------------------------------------------------------------------------------------------ PoSE
from harness.methods.pose import PoSE, pose_example, pose_sample, sequence_rng  # noqa: E402


def original_pose_recipe(ids: list, model_max: int, scaled: int, rng: random.Random):
    """``train_preprocess_function_pose`` for one document, call by call (``random`` -> ``rng``)."""
    len_chunk = min(len(ids), model_max)
    len_input = len(ids)
    lt1 = 0
    rt1 = rng.randint(1, (len_chunk + 1) // 2)
    rt2 = rng.randint(lt1 + len_chunk, len_input)
    lt2 = rt2 - (len_chunk - (rt1 - lt1))
    chunked_ids = ids[lt1:rt1] + ids[lt2:rt2]
    pos_ids = torch.arange(len(chunked_ids), dtype=torch.long)
    lt = 0
    rt = rng.randint(lt, scaled - len(pos_ids))
    pos_ids[:rt1 - lt1] += lt
    pos_ids[rt1 - lt1:] += rt
    return chunked_ids, pos_ids, rt1


@pytest.mark.parametrize("len_input,C,target", [(64, 64, 8), (320, 64, 8), (50, 64, 4), (7, 7, 1), (64, 64, 1),
                                                (200, 63, 4)])
def test_pose_positions_equal_original_recipe_and_invariants(len_input, C, target):
    scaled = C * target
    ids = list(range(100, 100 + len_input))
    for seed in range(200):
        want_ids, want_pos, rt1 = original_pose_recipe(ids, C, scaled, random.Random(seed))
        got_ids, got_pos = pose_example(torch.tensor(ids), C, scaled, random.Random(seed))
        assert got_ids.tolist() == want_ids and torch.equal(got_pos, want_pos)
        assert pose_sample(len_input, min(len_input, C), scaled, random.Random(seed))[0] == rt1
        n = min(len_input, C)
        assert got_pos.shape[0] == n and got_pos[0] == 0 and got_pos[-1] <= scaled - 1
        assert bool((got_pos[1:] > got_pos[:-1]).all())  # strictly increasing (inside and across the chunks)
        assert 1 <= rt1 <= (n + 1) // 2  # chunk lengths: rt1 and n - rt1, as the original
        assert torch.equal(got_pos[:rt1], torch.arange(rt1))
        assert bool((got_pos[rt1:].diff() == 1).all()) if n - rt1 > 1 else True
        assert got_ids[:rt1].tolist() == ids[:rt1]  # chunk 1 = the document's start


def test_pose_skip_distribution_covers_the_target():
    """Every chunk-1 length 1..(C+1)/2 and every skip 0..sC - C occurs, roughly uniformly (randint's law)."""
    C, scaled, n = 16, 128, 4000
    draws = [pose_sample(3 * C, C, scaled, random.Random(seed)) for seed in range(n)]
    rt1 = torch.tensor([d[0] for d in draws])
    rt2 = torch.tensor([d[2] for d in draws])
    rt = torch.tensor([d[3] for d in draws])
    assert set(rt1.tolist()) == set(range(1, (C + 1) // 2 + 1))
    assert set(rt.tolist()) == set(range(0, scaled - C + 1))
    assert set(rt2.tolist()) == set(range(C, 3 * C + 1))  # content end: uniform on len_chunk..len_input
    for x, lo, hi in ((rt1, 1, (C + 1) // 2), (rt, 0, scaled - C), (rt2, C, 3 * C)):
        assert abs(x.double().mean().item() - (lo + hi) / 2) < 0.05 * (hi - lo + 1)


def test_pose_train_batch_seeded_per_sequence_and_passes_positions():
    model = random_llama(kv_heads=2)
    m = PoSE(PoSE.Args(target=8, rope="pi", seed=3))
    m.apply(handle_of(model))
    ids = torch.randint(3, 250, (2, 64), generator=torch.Generator().manual_seed(0))
    b = m.train_batch(ids)
    assert set(b) == {"input_ids", "labels", "position_ids", "attention_mask"} and bool(b["attention_mask"].all())
    for i in range(2):
        want_ids, want_pos = pose_example(ids[i], 64, 512, sequence_rng(ids[i], 3))
        assert torch.equal(b["input_ids"][i], want_ids) and torch.equal(b["position_ids"][i], want_pos)
    b2 = m.train_batch(ids)
    assert torch.equal(b2["position_ids"], b["position_ids"])  # deterministic (resume, ranks)
    assert not torch.equal(b["position_ids"][0], b["position_ids"][1])  # each sequence its own draw
    # the jump is no document boundary: chunk 2 sees chunk 1
    pos = b["position_ids"][:1]
    r1 = int((pos[0].diff() != 1).nonzero()[0]) + 1
    x = b["input_ids"][:1].clone()
    out = model(input_ids=x, position_ids=pos, attention_mask=torch.ones_like(x)).logits
    x[0, 0] = (x[0, 0] + 1) % 250 + 3
    out2 = model(input_ids=x, position_ids=pos, attention_mask=torch.ones_like(x)).logits
    assert (out[0, r1:] - out2[0, r1:]).abs().max() > 1e-4


def test_pose_one_training_step(tmp_path):
    import numpy as np

    from harness.train import TrainArgs
    from harness.train.loop import finetune

    model = random_llama(kv_heads=2)
    h = handle_of(model)
    m = PoSE(PoSE.Args(target=8, rope="yarn"))
    m.apply(h)
    seen = []
    model.model.rotary_emb.register_forward_hook(
        lambda mod, args, kwargs, out: seen.append(kwargs.get("position_ids", args[-1]).detach().clone()),
        with_kwargs=True)
    a = TrainArgs(name="t", enabled=True, seq_len=64, tokens=64, global_batch=1, micro_batch=1, lr=1e-3,
                  warmup_steps=0, ema=False, save_every=0, seed=0)
    a.validate()
    m.check(64, a)
    chunks = np.random.default_rng(0).integers(3, 250, size=(4, 64)).astype(np.uint16)
    info = finetune(h, m, chunks, a, tmp_path / "ck", "fp")
    assert info["steps"] == 1 and math.isfinite(info["loss_first"])
    want = m.train_batch(torch.from_numpy(chunks[:1].astype(np.int64)))["position_ids"]
    assert any(p.shape == want.shape and torch.equal(p, want) for p in seen) and int(want.max()) >= 64


def test_pose_train_mode_leaves_harness_causal_while_training():
    from harness.methods.flex import CAUSAL_NAME, set_backend

    model = random_llama(kv_heads=2)
    h = handle_of(model)
    set_backend(model, "flex")
    m = PoSE(PoSE.Args())
    m.apply(h)
    assert model.config._attn_implementation == CAUSAL_NAME
    m.train_mode(h)
    assert model.config._attn_implementation == "sdpa"
    m.eval_mode(h)
    assert model.config._attn_implementation == CAUSAL_NAME


@pytest.mark.parametrize("rope,other", [("pi", {"name": "pi", "scale": 8.0}), ("yarn", {"name": "yarn", "scale": 8.0})])
def test_pose_inference_rope_equals_composed_method(rope, other):
    a, b = random_llama(kv_heads=2), random_llama(kv_heads=2)
    PoSE(PoSE.Args(target=8, rope=rope)).apply(handle_of(a))
    build_method(other).apply(handle_of(b))
    ra, rb = a.model.rotary_emb, b.model.rotary_emb
    assert torch.equal(ra.inv_freq, rb.inv_freq) and ra.attention_scaling == rb.attention_scaling
    ids = torch.randint(3, 250, (1, 200))
    assert torch.equal(logits(a, ids), logits(b, ids))
    assert not torch.equal(ra.inv_freq, random_llama().model.rotary_emb.inv_freq)


def test_pose_ntk_and_revised_yarn_equal_the_originals_rotary():
    d, base, s, C = 16, 10000.0, 8.0, 64
    model = random_llama(kv_heads=2)  # head_dim 16
    PoSE(PoSE.Args(target=s, rope="ntk")).apply(handle_of(model, ctx=C))
    # LlamaVanillaNTKScalingRotaryEmbedding: base * s ** (dim / (dim - 2))
    b2 = base * s ** (d / (d - 2))
    want = 1.0 / (b2 ** (torch.arange(0, d, 2).float() / d))
    assert torch.allclose(model.model.rotary_emb.inv_freq, want, rtol=1e-6, atol=0)
    model = random_llama(kv_heads=2)
    PoSE(PoSE.Args(target=s, rope="yarn_revised")).apply(handle_of(model, ctx=C))
    # LlamaYaRNScaledRotaryEmbedding.revised_yarn (beta_fast 32, beta_slow 1, original window C)

    def corr(rot):
        return (d * math.log(C / (rot * 2 * math.pi))) / (2 * math.log(base))

    low, high = max(math.floor(corr(32)), 0), min(math.ceil(corr(1)), d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float32) - low) / (high - low if high > low else 0.001)).clamp(0, 1)
    mask = 1 - ramp
    inv = 1.0 / (base ** (torch.arange(0, d, 2).float() / d))
    want = inv / ((1 - mask) * s + mask)
    r = model.model.rotary_emb
    assert torch.allclose(r.inv_freq, want, rtol=1e-6, atol=0)
    assert r.attention_scaling == pytest.approx(0.1 * math.log(s) + 1)
    yarn = random_llama(kv_heads=2)
    build_method({"name": "yarn", "scale": s}).apply(handle_of(yarn, ctx=C))
    assert not torch.allclose(r.inv_freq, yarn.model.rotary_emb.inv_freq)  # the two YaRN variants differ in the ramp


def test_pose_check_refuses_impossible_values():
    from harness.train import TrainArgs

    for bad in ({"target": 0.5}, {"rope": "dynamic"}, {"train_len": 2.0, "target": 1.5}, {"train_len": 0}):
        with pytest.raises(ConfigError, match="method=pose"):
            build_method({"name": "pose", **bad}).check(4096)
    with pytest.raises(ConfigError, match="method=pose: train.doc_masking"):
        build_method({"name": "pose"}).check(4096, TrainArgs(enabled=True, seq_len=4096, tokens=4096,
                                                              global_batch=1, doc_masking=True))
    from harness.conf_utils import group_defaults

    assert METHODS.get("pose") is PoSE
    build_method(group_defaults("method", "pose")).check(4096)


# ------------------------------------------------------------------------------------------------ points
@pytest.mark.parametrize("exp", ["tiny_study", "paper_llama2"])
def test_points_validate_and_pose_takes_the_same_optimizer_steps(exp):
    from omegaconf import OmegaConf

    from harness import conf_utils, pipeline

    got = {}
    for name in ("dca", "pose", "pi"):
        cfg = conf_utils.compose([f"experiment={exp}", f"point={exp}/{name}"])
        method, train = pipeline.validate(cfg, data=False)
        assert method.name == name and cfg.method.name == name
        assert dict(cfg.method) == conf_utils.group_defaults("method", name)  # the YAML as it is
        got[name] = (train, int(cfg.model.native_ctx))
        if exp == "paper_llama2" and name != "pi":
            assert "method" not in OmegaConf.load(conf_utils.find_conf(f"point/{exp}", name))
    assert not got["dca"][0].enabled
    pose, c = got["pose"]
    pi, _ = got["pi"]
    assert pose.enabled and pose.seq_len == c and pose.steps() == pi.steps()
    if exp == "tiny_study":   # 8 sequences of C per step: the same tokens per step as PI's one 8C sequence
        assert pose.tokens == pi.tokens and pose.global_batch * pose.seq_len == pi.global_batch * pi.seq_len
    else:                     # the paper point keeps the batch in sequences: tokens scaled by seq_len (C / 8C)
        assert pose.tokens * pi.seq_len == pi.tokens * pose.seq_len
    if exp == "paper_llama2":
        assert build_method({"name": "dca"}).check(c) == (3072, 512)
