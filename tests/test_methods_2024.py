"""Training-free methods the field compares against since 2024 (issue 19): StreamingLLM (attention sinks) and STRING
(shifted RoPE).

Each method is checked on small random Llamas (grouped KV heads, fp32) against a dense reference attention written
from the original's arithmetic, independent of the implementation's re-rotation and blocking: the reference un-rotates
q/k and rotates them again at the explicit positions the original uses, with explicit masks and one plain softmax.
- StreamingLLM (mit-han-lab/streaming-llm): the cache of every query is produced by replaying
  ``StartRecentKVCache.__call__``'s eviction token by token (``eval_long_ppl.py``), keys are rotated at their slots
  in that cache and the query at the last slot (``pos_shift/modify_llama.py``).
- STRING (HKUNLP/STRING ``string_for_llama.py``): the diagonal part (query at i, keys at j, flash window [S, 0]: d < S,
  or d <= S in the prefill code) and the shifted part (query at i - S + W, the last L - S queries against the first
  L - S keys, causal), logits scaled by the code's cos/sin factor squared, both parts in one softmax (= the original's
  log-sum-exp merge)."""
from __future__ import annotations

import math

import pytest
import torch
from conftest import random_llama
from transformers import DynamicCache

from harness import conf_utils, pipeline
from harness.config import ConfigError
from harness.methods import METHODS, build_method
from harness.methods import _blockwise as bw
from harness.methods import flex as fx
from harness.methods.streaming_llm import StreamingLLM
from harness.methods.string import CODE_ATTENTION_FACTOR, String, relative_positions
from harness.models import ModelHandle

THETA, CTX, LOGITS = 10000.0, 64, 1e-5


def rot(x, pos, d):
    """Rotate x [..., L, D] at positions pos [L] (float64, rotate_half layout, theta 10000)."""
    inv = 1.0 / (THETA ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    ang = torch.as_tensor(pos, dtype=torch.float64)[..., None] * inv
    ang = torch.cat((ang, ang), -1)
    x1, x2 = x.chunk(2, -1)
    return x * ang.cos() + torch.cat((-x2, x1), -1) * ang.sin()


def unrotated(query, key):
    """The attention function receives q/k rotated at 0..L-1 (no cache, no padding): undo it, in float64."""
    L, d = query.shape[2], query.shape[3]
    pos = torch.arange(L)
    return rot(query.double(), -pos, d), rot(key.double(), -pos, d)


# ------------------------------------------------------------------------------------------------ dense references
def streaming_caches(L: int, start_size: int, recent_size: int) -> list[list[int]]:
    """The token indices in the cache while token t is processed, replaying the original's loop: feed one token,
    attend to the cache + it, then ``StartRecentKVCache.__call__`` keeps the first start_size and last recent_size
    entries once the cache exceeds start_size + recent_size."""
    cache, out = [], []
    for t in range(L):
        cache = cache + [t]
        out.append(list(cache))
        if len(cache) > start_size + recent_size:
            cache = cache[:start_size] + cache[len(cache) - recent_size:]
    return out


def streaming_reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    n_sink, window = module.test_streaming
    assert attention_mask is None and query.shape[2] == key.shape[2], "reference: one prefill, no padding"
    b, h, L, d = query.shape
    g = h // key.shape[1]
    q0, k0 = unrotated(query, key)
    k0, v = k0.repeat_interleave(g, 1), value.double().repeat_interleave(g, 1)
    caches = streaming_caches(L, n_sink, window - 1)  # recent_size = window - 1
    n = max(len(c) for c in caches)
    idx = torch.tensor([c + [0] * (n - len(c)) for c in caches])  # [L, n] key index of each cache slot
    real = torch.tensor([[s < len(c) for s in range(n)] for c in caches])
    last = torch.tensor([len(c) - 1 for c in caches])
    k_c = rot(k0[:, :, idx], torch.arange(n), d)  # pos_shift: keys at their cache slots ...
    q_c = rot(q0, last, d)  # ... the query at the last one
    s = torch.einsum("bhtd,bhtnd->bhtn", q_c, k_c) / math.sqrt(d)
    p = torch.softmax(s.masked_fill(~real, float("-inf")), -1)
    out = torch.einsum("bhtn,bhtnd->bhtd", p, v[:, :, idx])
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def string_reference(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    S, W, factor, inclusive = module.test_string
    assert attention_mask is None and query.shape[2] == key.shape[2], "reference: one prefill, no padding"
    b, h, L, d = query.shape
    g = h // key.shape[1]
    q0, k0 = unrotated(query, key)
    k0, v = k0.repeat_interleave(g, 1), value.double().repeat_interleave(g, 1)
    pos = torch.arange(L)
    q0, k0 = q0 * factor, k0 * factor  # cos_cached / sin_cached carry the attention factor
    k = rot(k0, pos, d)
    i, j = pos[:, None], pos[None]
    # diagonal part: flash_attn_func(causal=True, window_size=[S, 0]) -> 0 <= i - j <= S (inclusive), or d < S
    diag = (i - j >= 0) & ((i - j <= S) if inclusive else (i - j < S))
    s_diag = (rot(q0, pos, d) @ k.transpose(-1, -2)) / math.sqrt(d)
    # shifted part: queries [S, L) rotated at position_ids - S + W against keys [0, L - S), causal (square)
    shifted = torch.zeros(L, L, dtype=torch.bool)
    if L > S:
        shifted[S:, :L - S] = torch.ones(L - S, L - S, dtype=torch.bool).tril()
    s_shift = (rot(q0, pos - S + W, d) @ k.transpose(-1, -2)) / math.sqrt(d)
    logits = torch.cat([s_diag.masked_fill(~diag, float("-inf")), s_shift.masked_fill(~shifted, float("-inf"))], -1)
    p = torch.softmax(logits, -1)  # one softmax over both parts = the log-sum-exp merge
    out = p @ torch.cat([v, v], 2)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


bw.register_attention("test_streaming_reference", streaming_reference)
bw.register_attention("test_string_reference", string_reference)


def reference_model(kind: str, settings: tuple, seed: int = 0):
    model = random_llama(kv_heads=2, ctx=CTX, seed=seed)
    for m in bw.attention_modules(model):
        setattr(m, f"test_{kind}", settings)
    model.set_attn_implementation(f"test_{kind}_reference")
    return model


def method_model(name: str, seed: int = 0, backend: str | None = None, **kw):
    model = random_llama(kv_heads=2, ctx=CTX, seed=seed)
    if backend is not None:
        fx.set_backend(model, backend)
    method = build_method({"name": name, **kw})
    method.apply(ModelHandle(model, None, "random", CTX, {}))
    return model, method


def ids_of(b=2, n=100, seed=1):
    return torch.randint(3, 250, (b, n), generator=torch.Generator().manual_seed(seed))


def logits(model, ids, **kw):
    with torch.no_grad():
        return model(input_ids=ids, **kw).logits


def max_diff(a, b) -> float:
    return (a - b).abs().max().item()


def greedy_with_cache(model, prompt, steps: int):
    """Greedy decoding with the KV cache: (tokens, last-position logits of every step)."""
    cache, seq, outs = DynamicCache(config=model.config), prompt, []
    with torch.no_grad():
        step_in = prompt
        for _ in range(steps + 1):
            last = model(input_ids=step_in, past_key_values=cache, use_cache=True).logits[:, -1]
            outs.append(last)
            nxt = last.argmax(-1, keepdim=True)
            seq = torch.cat([seq, nxt], 1)
            step_in = nxt
    return seq, torch.stack(outs, 1)


def greedy_recomputed(model, prompt, steps: int):
    """Greedy decoding with the whole sequence recomputed (no cache) at every step."""
    seq, outs = prompt, []
    with torch.no_grad():
        for _ in range(steps + 1):
            last = model(input_ids=seq).logits[:, -1]
            outs.append(last)
            seq = torch.cat([seq, last.argmax(-1, keepdim=True)], 1)
    return seq, torch.stack(outs, 1)


# ------------------------------------------------------------------------------------------------ registry
def test_registered_yaml_defaults_and_llama2_settings():
    from harness.conf_utils import group_defaults

    for name, cls in (("streaming_llm", StreamingLLM), ("string", String)):
        assert METHODS.get(name) is cls
        m = build_method(group_defaults("method", name))
        assert m.name == name and m.params()["name"] == name
    # LLaMA2-7B (C = 4096): 4 sinks + 4092 = a 4096 cache; S = int(0.33 * 4096) = 1351, W = 128
    assert build_method({"name": "streaming_llm"}).check(4096) == 4092
    assert build_method({"name": "string"}).check(4096) == (1351, 128)
    assert build_method({"name": "string"}).args.attention_factor == pytest.approx(0.1 * math.log(2) + 1)
    for point in ("streaming_llm", "string"):
        cfg = conf_utils.compose(["experiment=paper_llama2", f"point=paper_llama2/{point}"])
        method, train = pipeline.validate(cfg, data=False)
        assert method.name == point and not train.enabled and cfg.model.native_ctx == 4096
        cfg = conf_utils.compose(["experiment=tiny_study", f"point=tiny_study/{point}"])
        method, train = pipeline.validate(cfg, data=False)
        assert method.name == point and not train.enabled and cfg.model.name == "tiny_llama"
    assert build_method({"name": "streaming_llm"}).check(512) == 508
    assert build_method({"name": "string"}).check(512) == (168, 16)


# ------------------------------------------------------------------------------------------------ StreamingLLM
def test_streaming_eviction_replay_is_sinks_plus_window():
    """The prefill rule (query i: keys {0..n_sink-1} U {i-window+1..i}) is the original's token-by-token loop with
    recent_size = window - 1."""
    for n_sink, window in ((4, 9), (0, 5), (3, 1), (2, 30)):
        for t, cache in enumerate(streaming_caches(40, n_sink, window - 1)):
            want = sorted(set(range(min(n_sink, t + 1))) | set(range(max(0, t - window + 1), t + 1)))
            assert cache == want, (n_sink, window, t)


@pytest.mark.parametrize("n_sink,window", [(4, 0.25), (1, 0.125), (0, 0.25), (4, 0.0625)])
def test_streaming_prefill_equals_original_arithmetic(n_sink, window):
    """(a) Logits of the whole model equal the dense replay of the original (evicting cache, positions re-assigned
    inside it), fp32 <= 1e-5, on inputs well beyond the cache."""
    ids = ids_of(2, 100)
    model, method = method_model("streaming_llm", n_sink=n_sink, window=window, block_q=16, block_k=8)
    w = method.check(CTX)
    ref = logits(reference_model("streaming", (n_sink, w)), ids)
    out = logits(model, ids)
    assert max_diff(out, ref) <= LOGITS
    plain = logits(random_llama(kv_heads=2, ctx=CTX), ids)
    assert max_diff(out[:, n_sink + w:], plain[:, n_sink + w:]) > 1e-3  # the sinks + window rule is in force


def test_streaming_greedy_decoding_with_cache_equals_recomputed_reference():
    """(b) Greedy decoding with the KV cache (the cache keeps everything; the query reads the sinks and its window)
    equals the dense reference recomputed on the whole sequence at every step."""
    prompt = ids_of(2, 20, seed=3)
    model, method = method_model("streaming_llm", n_sink=2, window=0.25, block_q=8, block_k=8)  # cache 2 + 16
    seq, out = greedy_with_cache(model, prompt, steps=24)
    seq_r, out_r = greedy_recomputed(reference_model("streaming", (2, method.check(CTX))), prompt, steps=24)
    assert torch.equal(seq, seq_r)
    assert max_diff(out, out_r) <= LOGITS


def test_streaming_short_input_is_the_unmodified_model():
    """(c) Up to n_sink + window tokens (default: the native window C) nothing is evicted: the stock model."""
    ids = ids_of(2, CTX)
    plain = logits(random_llama(kv_heads=2, ctx=CTX), ids)
    model, method = method_model("streaming_llm", block_q=16, block_k=16)
    assert method.check(CTX) == CTX - 4
    assert max_diff(logits(model, ids), plain) <= LOGITS
    model, _ = method_model("streaming_llm", n_sink=3, window=0.25, block_q=16, block_k=16)  # 3 + 16
    assert max_diff(logits(model, ids[:, :19]), plain[:, :19]) <= LOGITS


# ------------------------------------------------------------------------------------------------ STRING
def test_string_relative_positions():
    m, n = torch.tensor([0, 5, 9, 20]), torch.tensor([0, 3, 8, 16])
    r = relative_positions(m, n, offset=6, local=2)
    for a, x in enumerate(m.tolist()):
        for c, y in enumerate(n.tolist()):
            assert r[a, c].item() == (x - y if x - y < 6 else x - y - 6 + 2)  # paper Fig. 5: d - S + W from S on


@pytest.mark.parametrize("offset,local,inclusive,factor", [(0.25, 0.0625, False, None), (0.25, 0.0625, True, None),
                                                           (0.5, 0.0, False, 1.0), (0.15625, 0.03125, True, 1.0)])
def test_string_prefill_equals_original_arithmetic(offset, local, inclusive, factor):
    """(a) Logits of the whole model equal the dense two-part reference (explicit positions and masks, one softmax),
    fp32 <= 1e-5, with the code's attention factor (default) or none, and with the prefill code's doubled key."""
    ids = ids_of(2, 100)
    kw = {} if factor is None else {"attention_factor": factor}
    model, method = method_model("string", shifted_offset=offset, local_window=local, inclusive_window=inclusive,
                                 block_q=16, block_k=8, **kw)
    S, W = method.check(CTX)
    f = CODE_ATTENTION_FACTOR if factor is None else factor
    ref = logits(reference_model("string", (S, W, f, inclusive)), ids)
    out = logits(model, ids)
    assert max_diff(out, ref) <= LOGITS
    other = logits(reference_model("string", (S, W, f, not inclusive)), ids)
    assert max_diff(out[:, S:], other[:, S:]) > 1e-4  # the doubled key at d = S is a real difference


def test_string_greedy_decoding_with_cache_equals_recomputed_reference():
    """(b) Greedy decoding with the KV cache equals the dense reference recomputed at every step (the original's
    decoding path: the last S keys at their distances, the rest shifted)."""
    prompt = ids_of(2, 20, seed=4)
    model, method = method_model("string", shifted_offset=0.25, local_window=0.0625, block_q=8, block_k=8)
    S, W = method.check(CTX)
    seq, out = greedy_with_cache(model, prompt, steps=40)  # 20 -> 60 tokens: S = 16 is passed from the prompt on
    seq_r, out_r = greedy_recomputed(reference_model("string", (S, W, CODE_ATTENTION_FACTOR, False)), prompt, 40)
    assert torch.equal(seq, seq_r)
    assert max_diff(out, out_r) <= LOGITS


def test_string_short_input_is_the_unmodified_model():
    """(c) Inputs of at most S tokens see no shifted distance: with attention_factor 1 they are the stock model; the
    code's default factor only rescales the logits (it is the reference with no shift)."""
    ids = ids_of(2, 16)
    plain = logits(random_llama(kv_heads=2, ctx=CTX), ids)
    model, method = method_model("string", shifted_offset=0.25, local_window=0.0625, attention_factor=1.0,
                                 block_q=8, block_k=8)
    assert method.check(CTX)[0] == 16
    assert max_diff(logits(model, ids), plain) <= LOGITS
    model, _ = method_model("string", shifted_offset=0.25, local_window=0.0625, block_q=8, block_k=8)
    out = logits(model, ids)
    assert max_diff(out, plain) > 1e-4
    assert max_diff(out, logits(reference_model("string", (16, 4, CODE_ATTENTION_FACTOR, False)), ids)) <= LOGITS


# ------------------------------------------------------------------------------------------------ both
@pytest.mark.parametrize("name,kw", [("streaming_llm", {"n_sink": 3, "window": 0.125}),
                                     ("string", {"shifted_offset": 0.125, "local_window": 0.03125})])
def test_batch_with_right_and_left_padding(name, kw):
    model, _ = method_model(name, block_q=8, block_k=8, **kw)
    short, long = ids_of(1, 21, seed=5), ids_of(1, 30, seed=6)
    dec = model.get_decoder()

    def run(ids, **k):
        with torch.no_grad():
            return dec(input_ids=ids, use_cache=False, **k).last_hidden_state

    alone_s, alone_l = run(short), run(long)
    pad = torch.zeros(1, 9, dtype=torch.long)
    ids = torch.cat([long, torch.cat([short, pad], 1)])
    am = torch.ones(2, 30, dtype=torch.long)
    am[1, 21:] = 0
    out = run(ids, attention_mask=am)
    assert max_diff(out[0], alone_l[0]) <= LOGITS and max_diff(out[1, :21], alone_s[0]) <= LOGITS
    ids = torch.cat([long, torch.cat([pad, short], 1)])
    am = torch.ones(2, 30, dtype=torch.long)
    am[1, :9] = 0
    out = run(ids, attention_mask=am, position_ids=(am.cumsum(-1) - 1).clamp_min(0))
    assert max_diff(out[0], alone_l[0]) <= LOGITS and max_diff(out[1, 9:], alone_s[0]) <= LOGITS


@pytest.mark.parametrize("name", ["streaming_llm", "string"])
def test_no_fused_path_flex_fails_clearly_auto_falls_back(name):
    ids = ids_of(1, 40)
    model, _ = method_model(name, backend="auto")
    assert torch.isfinite(logits(model, ids)).all()
    model, _ = method_model(name, backend="flex")
    with pytest.raises(ValueError, match=f"attention.backend=flex is not available for method={name}") as e:
        logits(model, ids)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("overrides,key", [
    (["method=streaming_llm", "method.n_sink=-1"], "n_sink"),
    (["method=streaming_llm", "method.window=-0.5"], "window"),
    (["method=streaming_llm", "method.window=0.0001"], "window"),  # rounds to 0 tokens at C = 512
    (["method=streaming_llm", "method.n_sink=512"], "window"),  # window 0 = C - n_sink = 0 tokens
    (["method=streaming_llm", "method.window=4096"], "window"),  # a token count written as x C
    (["method=streaming_llm", "method.block_q=0"], "block_q"),
    (["method=string", "method.shifted_offset=0"], "shifted_offset"),
    (["method=string", "method.shifted_offset=1.5"], "shifted_offset"),
    (["method=string", "method.shifted_offset=0.001"], "shifted_offset"),  # int(0.512) = 0 tokens
    (["method=string", "method.local_window=-0.1"], "local_window"),
    (["method=string", "method.local_window=0.4"], "local_window"),  # W >= S: not a shift down
    (["method=string", "method.attention_factor=0"], "attention_factor"),
    (["method=string", "method.block_k=0"], "block_k"),
])
def test_impossible_settings_are_one_line_before_loading(overrides, key):
    """(d) ``pipeline.validate`` (nothing loaded) refuses them with one ConfigError line naming the key."""
    cfg = conf_utils.compose(["model=tiny_llama", "train=none", *overrides])
    with pytest.raises(ConfigError) as e:
        pipeline.validate(cfg, data=False)
    msg = str(e.value)
    assert key in msg and f"method={overrides[0].split('=')[1]}" in msg and "\n" not in msg
