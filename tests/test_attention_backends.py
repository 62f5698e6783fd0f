"""Fused attention backends (issue 17, ``harness/methods/flex.py``): every fused path equals its reference on small
random Llamas (grouped KV heads), fp32 logits <= 1e-5 and gradients <= 1e-4, prefill and KV-cache decoding.

On CPU, flex_attention runs eagerly (torch 2.13); it has no CPU backward, so gradients go through
``flex.dense_attention`` (the same mask functions evaluated densely), which is itself tested equal to eager
flex_attention here."""
from __future__ import annotations

import pytest
import torch
from conftest import random_llama
from transformers import DynamicCache

from harness.config import ConfigError
from harness.methods import build_method
from harness.methods import flex as fx
from harness.models import ModelHandle

LOGITS, GRADS = 1e-5, 1e-4


def model_with(name: str | None, backend: str, ctx: int = 32, seed: int = 0, **kw):
    model = random_llama(kv_heads=2, ctx=ctx, seed=seed)
    handle = ModelHandle(model, None, "random", ctx, {})
    fx.set_backend(model, backend)
    method = None
    if name is not None:
        method = build_method({"name": name, **kw})
        method.apply(handle)
    return model, handle, method


def ids_of(b=2, n=70, seed=1):
    return torch.randint(3, 250, (b, n), generator=torch.Generator().manual_seed(seed))


def prefill_and_decode(model, ids, n_prompt: int, steps: int, **kw):
    """Full-sequence logits, plus the last-token logits of a prefill of ``n_prompt`` tokens and ``steps`` decoding
    steps with the KV cache."""
    with torch.no_grad():
        full = model(input_ids=ids, **kw).logits
        cache = DynamicCache(config=model.config)
        out = [model(input_ids=ids[:, :n_prompt], past_key_values=cache, use_cache=True).logits[:, -1]]
        for t in range(n_prompt, n_prompt + steps):
            out.append(model(input_ids=ids[:, t:t + 1], past_key_values=cache, use_cache=True).logits[:, -1])
    return full, torch.stack(out)


def loss_grads(model, ids, **kw):
    model.zero_grad()
    model.train()
    out = model(input_ids=ids, labels=ids, **kw)
    out.loss.backward()
    model.eval()
    return out.logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def assert_grads_equal(g_ref: dict, g_fx: dict):
    assert g_ref.keys() == g_fx.keys() and g_ref
    worst = max(max_diff(g_ref[n], g_fx[n]) for n in g_ref)
    assert worst <= GRADS, worst


# ------------------------------------------------------------------------------------------------ the kernel layer
def test_dense_attention_equals_eager_flex_attention_and_merge_is_one_softmax():
    g = torch.Generator().manual_seed(0)
    b, h, n_kv, lq, kv, d = 2, 4, 2, 13, 29, 8
    q = torch.randn(b, h, lq, d, generator=g)
    k = torch.randn(b, n_kv, kv, d, generator=g)
    v = torch.randn(b, n_kv, kv, d, generator=g)
    pos = torch.randint(0, 40, (b, kv), generator=g)
    valid = torch.rand(b, kv, generator=g) > 0.2
    off = kv - lq

    def mod(bi, hi, qi, ki):  # causal, padding, a position band, one row fully masked (query 0 of batch 1)
        return (qi + off >= ki) & valid[bi, ki] & ((pos[bi, qi + off] - pos[bi, ki]).abs() < 17) & \
            ~((bi == 1) & (qi == 0))

    out_f, lse_f = fx.flex(q, k, v, mod, ("test",), (pos, valid), 0.3, lse=True)
    out_d, lse_d = fx.dense_attention(q, k, v, mod, 0.3)
    assert max_diff(out_f, out_d) <= 1e-6
    fin = torch.isfinite(lse_d)
    assert torch.equal(fin, torch.isfinite(lse_f)) and not bool(fin[1, :, 0].any())
    assert max_diff(lse_f[fin], lse_d[fin]) <= 1e-5
    assert bool((out_f[1, :, 0] == 0).all())
    # natural-log LSE: recompute by hand for one row
    kk = k.repeat_interleave(2, 1)
    s = (q[0, 3] @ kk[0, 3].T) * 0.3
    m = torch.tensor([bool(mod(torch.tensor(0), torch.tensor(3), torch.tensor(5), torch.tensor(j))) for j in range(kv)])
    assert abs(torch.logsumexp(s[5][m], 0).item() - lse_f[0, 3, 5].item()) <= 1e-5
    # log-sum-exp merge of two disjoint key sets == one softmax over their union
    half = torch.arange(kv) % 2 == 0

    def a(bi, hi, qi, ki):
        return mod(bi, hi, qi, ki) & half[ki]

    def c(bi, hi, qi, ki):
        return mod(bi, hi, qi, ki) & ~half[ki]

    merged = fx.merge([fx.flex(q, k, v, a, ("a",), (pos, valid), 0.3, lse=True),
                       fx.flex(q, k, v, c, ("c",), (pos, valid), 0.3, lse=True)])
    assert max_diff(merged, out_d) <= 1e-6


def test_backend_selection_and_validation():
    model, _, _ = model_with(None, "auto")
    assert model.config._attn_implementation == "sdpa"  # CPU, auto: the model keeps its own attention
    mod = model.model.layers[0].self_attn
    assert fx.resolve(mod, torch.device("cpu")) == "reference"
    assert fx.resolve(mod, torch.device("cuda")) == "flex"
    model, _, _ = model_with(None, "flex")
    assert model.config._attn_implementation == fx.CAUSAL_NAME
    with pytest.raises(ConfigError, match="attention.backend"):
        fx.set_backend(model, "triton")
    from harness import pipeline
    from harness.conf_utils import compose

    cfg = compose(["attention.backend=bogus"])
    with pytest.raises(ConfigError, match="attention.backend='bogus'"):
        pipeline.validate(cfg)
    assert pipeline.attention_args(compose([])).backend == "auto"


# ------------------------------------------------------------------------------------------------ Self-Extend
@pytest.mark.parametrize("float_shift", [False, True])
def test_self_extend_flex_equals_reference_prefill_decode_grads(float_shift):
    ids = ids_of()
    kw = dict(window=0.25, group=3, float_shift=float_shift, block_q=16, block_k=16)
    ref, _, _ = model_with("self_extend", "reference", **kw)
    fus, _, _ = model_with("self_extend", "flex", **kw)
    r, f = prefill_and_decode(ref, ids, 60, 4), prefill_and_decode(fus, ids, 60, 4)
    assert max_diff(r[0], f[0]) <= LOGITS and max_diff(r[1], f[1]) <= LOGITS
    if not float_shift:
        (lr, gr), (lf, gf) = loss_grads(ref, ids[:, :40]), loss_grads(fus, ids[:, :40])
        assert max_diff(lr, lf) <= LOGITS
        assert_grads_equal(gr, gf)


def test_self_extend_flex_with_right_and_left_padding():
    kw = dict(window=0.25, group=4, block_q=8, block_k=8)  # 0.25 C = 8 tokens
    ref, _, _ = model_with("self_extend", "reference", **kw)
    fus, _, _ = model_with("self_extend", "flex", **kw)
    ids = ids_of(2, 30, seed=3)
    am = torch.ones(2, 30, dtype=torch.long)
    am[1, :9] = 0  # left padding, padding-aware positions
    pos = (am.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        r = ref(input_ids=ids, attention_mask=am, position_ids=pos).logits
        f = fus(input_ids=ids, attention_mask=am, position_ids=pos).logits
        assert max_diff(r[0], f[0]) <= LOGITS and max_diff(r[1, 9:], f[1, 9:]) <= LOGITS
        am = torch.ones(2, 30, dtype=torch.long)
        am[1, 21:] = 0  # right padding
        r, f = ref(input_ids=ids, attention_mask=am).logits, fus(input_ids=ids, attention_mask=am).logits
        assert max_diff(r[0], f[0]) <= LOGITS and max_diff(r[1, :21], f[1, :21]) <= LOGITS


# ------------------------------------------------------------------------------------------------ LM-Infinite
def test_lm_infinite_flex_equals_reference_prefill_decode_grads_padding():
    ids = ids_of()
    kw = dict(n_global=3, n_local=0.5, limit_distance=0.375, block_q=16, block_k=16)  # 16 and 12 tokens at C = 32
    ref, _, _ = model_with("lm_infinite", "reference", **kw)
    fus, _, _ = model_with("lm_infinite", "flex", **kw)
    r, f = prefill_and_decode(ref, ids, 60, 4), prefill_and_decode(fus, ids, 60, 4)
    assert max_diff(r[0], f[0]) <= LOGITS and max_diff(r[1], f[1]) <= LOGITS
    (lr, gr), (lf, gf) = loss_grads(ref, ids[:, :40]), loss_grads(fus, ids[:, :40])
    assert max_diff(lr, lf) <= LOGITS
    assert_grads_equal(gr, gf)
    am = torch.ones(2, 40, dtype=torch.long)
    am[1, :7] = 0  # left padding: the global tokens are the first real ones
    pos = (am.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        r = ref(input_ids=ids[:, :40], attention_mask=am, position_ids=pos).logits
        f = fus(input_ids=ids[:, :40], attention_mask=am, position_ids=pos).logits
    assert max_diff(r[0], f[0]) <= LOGITS and max_diff(r[1, 7:], f[1, 7:]) <= LOGITS


# ------------------------------------------------------------------------------------------------ LongLoRA S2-Attn
@pytest.mark.parametrize("impl", ["flash", "roll"])
def test_s2_attn_flex_equals_reference_forward_and_grads(impl):
    ids = ids_of(2, 48, seed=5)
    am = torch.ones(2, 48, dtype=torch.long)
    am[1, 41:] = 0
    models = []
    for backend in ("reference", "flex"):
        model, handle, meth = model_with("longlora", backend, group_size_ratio=0.25, s2_impl=impl)
        meth.train_mode(handle)
        for n, p in model.named_parameters():  # non-zero LoRA B, so the adapters matter
            if "lora_B" in n:
                torch.nn.init.normal_(p, std=0.05, generator=torch.Generator().manual_seed(hash(n) % 1000))
        models.append(model)
    ref, fus = models
    for m in models:
        m.train()
    with torch.no_grad():  # eval of the training path: the real (eager) flex_attention call
        assert max_diff(ref(input_ids=ids, attention_mask=am).logits[0],
                        fus(input_ids=ids, attention_mask=am).logits[0]) <= LOGITS
    (lr, gr), (lf, gf) = loss_grads(ref, ids, attention_mask=am), loss_grads(fus, ids, attention_mask=am)
    assert max_diff(lr[0], lf[0]) <= LOGITS and max_diff(lr[1, :41], lf[1, :41]) <= LOGITS
    assert_grads_equal(gr, gf)


# ------------------------------------------------------------------------------------------------ documents
def packed_positions(lengths, b=2):
    pos = torch.cat([torch.arange(n) for n in lengths])
    return pos[None].expand(b, -1)


@pytest.mark.parametrize("name,kw", [(None, {}), ("yarn", {"scale": 2.0}),
                                     ("entropy_abf", {"rope_theta": 50000.0, "exempt_layers": 1})])
def test_document_masking_flex_equals_transformers_sdpa(name, kw):
    """Packed documents (restarting position_ids, no attention mask): transformers' dense sdpa document mask vs the
    flex block mask of ``harness_causal``; Entropy-ABF wraps whichever implementation the backend chose."""
    ids = ids_of(2, 40, seed=7)
    pos = packed_positions([13, 9, 18])
    ref, _, _ = model_with(name, "reference", **kw)
    fus, _, _ = model_with(name, "flex", **kw)
    assert ref.config._attn_implementation == ("entropy_abf" if name == "entropy_abf" else "sdpa")
    if name == "entropy_abf":
        assert fus.model.layers[0].self_attn._eabf["base"] == fx.CAUSAL_NAME
    with torch.no_grad():
        r = ref(input_ids=ids, position_ids=pos, use_cache=False).logits
        f = fus(input_ids=ids, position_ids=pos, use_cache=False).logits
        alone = ref(input_ids=ids[:, 13:22], use_cache=False).logits  # the second document by itself
    assert max_diff(r, f) <= LOGITS
    assert max_diff(f[:, 13:22], alone) <= LOGITS  # no attention across documents
    (lr, gr) = loss_grads(ref, ids, position_ids=pos, use_cache=False)
    (lf, gf) = loss_grads(fus, ids, position_ids=pos, use_cache=False)
    assert max_diff(lr, lf) <= LOGITS
    assert_grads_equal(gr, gf)


def test_harness_causal_padding_and_decoding():
    ids = ids_of(2, 30, seed=9)
    ref, _, _ = model_with(None, "reference")
    fus, _, _ = model_with(None, "flex")
    am = torch.ones(2, 30, dtype=torch.long)
    am[1, :6] = 0
    pos = (am.cumsum(-1) - 1).clamp_min(0)
    with torch.no_grad():
        r = ref(input_ids=ids, attention_mask=am, position_ids=pos).logits
        f = fus(input_ids=ids, attention_mask=am, position_ids=pos).logits
    assert max_diff(r[0], f[0]) <= LOGITS and max_diff(r[1, 6:], f[1, 6:]) <= LOGITS
    r, f = prefill_and_decode(ref, ids, 24, 3), prefill_and_decode(fus, ids, 24, 3)
    assert max_diff(r[0], f[0]) <= LOGITS and max_diff(r[1], f[1]) <= LOGITS
    with torch.no_grad():  # a multi-token chunk after a cache: flex with the causal offset
        cache = DynamicCache(config=ref.config)
        ref(input_ids=ids[:, :20], past_key_values=cache, use_cache=True)
        r = ref(input_ids=ids[:, 20:], past_key_values=cache, use_cache=True).logits
        cache = DynamicCache(config=fus.config)
        fus(input_ids=ids[:, :20], past_key_values=cache, use_cache=True)
        f = fus(input_ids=ids[:, 20:], past_key_values=cache, use_cache=True).logits
    assert max_diff(r, f) <= LOGITS


# ------------------------------------------------------------------------------------------------ Landmark
def test_landmark_has_no_fused_path_flex_fails_clearly_auto_falls_back():
    from test_methods_attention import LandmarkTok

    ids = ids_of(1, 40)
    for backend in ("auto", "flex"):
        model = random_llama(kv_heads=2, ctx=64)
        handle = ModelHandle(model, LandmarkTok(), "random", 64, {})
        fx.set_backend(model, backend)
        build_method({"name": "landmark", "mem_freq": 7, "train_len": 32, "top_k": 1}).apply(handle)
        if backend == "auto":
            with torch.no_grad():
                assert torch.isfinite(model(input_ids=ids).logits).all()
        else:
            with pytest.raises(ValueError, match="attention.backend=flex is not available for method=landmark"):
                with torch.no_grad():
                    model(input_ids=ids)
