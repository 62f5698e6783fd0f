"""The RoPE family (issue 3): every method against transformers' implementation where it has the rope type, and
against the papers' formulas / Table 8 numbers and the test vectors of methods.md (head dims 64 and 128, partial
rotary 0.4 via Phi, GQA). Also: stateless length dependence, KV-cache semantics (incl. transformers' stale-cache
dynamic-NTK bug, #25104), LongRoPE factors files, CLEX == NTK(alpha = 2t - 1) at initialisation, checkpoints."""
from __future__ import annotations

import json
import math

import pytest
import torch
from conftest import random_llama

from harness.config import ConfigError
from harness.methods import METHODS, build_method, check_checkpoint_method, save_method
from harness.methods.rope import default_inv_freq, inv_freq_of, ntk_multiplier, rerotate_keys
from harness.models import ModelHandle

C = 32  # native window of the random test models


def handle_of(model, ctx=C):
    return ModelHandle(model, None, "random", ctx, {})


def apply(name, model, ctx=C, **kw):
    from harness.conf_utils import group_defaults

    node = group_defaults("method", name)
    node.update(kw)
    m = build_method(node)
    m.apply(handle_of(model, ctx))
    return m


def rope_at(model, length):
    """(inv_freq, attention_scaling) the model uses for an input of ``length`` tokens."""
    rot = model.get_decoder().rotary_emb
    x = torch.zeros(1, length, 4)
    with torch.no_grad():
        rot(x, position_ids=torch.arange(length)[None])
    if hasattr(rot, "rope_state") and type(rot).__name__ == "CLEXRotaryEmbedding":
        return rot.rope_state(length)
    return rot.inv_freq.detach().clone(), float(rot.attention_scaling)


def llama(head_dim=64, theta=10000.0, ctx=C, layers=1, kv_heads=None, heads=2):
    return random_llama(hidden=head_dim * heads, heads=heads, kv_heads=kv_heads, layers=layers, ctx=ctx, theta=theta,
                        head_dim=head_dim)


def phi(ctx=C, layers=1):
    """Phi-2 style: partial rotary 0.4 (head_dim 80 -> rotary dim 32)."""
    from transformers import PhiConfig, PhiForCausalLM

    torch.manual_seed(0)
    cfg = PhiConfig(vocab_size=256, hidden_size=160, intermediate_size=256, num_hidden_layers=layers,
                    num_attention_heads=2, max_position_embeddings=ctx, partial_rotary_factor=0.4,
                    rope_theta=10000.0, bos_token_id=1, eos_token_id=2, pad_token_id=0)
    cfg._attn_implementation = "sdpa"
    return PhiForCausalLM(cfg).eval()


def dims(model):
    from harness.methods.rope import rope_dims

    return rope_dims(model.config)


MODELS = {"hd64": lambda: llama(64), "hd128": lambda: llama(128), "phi_partial04": phi,
          "gqa": lambda: llama(64, heads=4, kv_heads=2)}


# ---------------------------------------------------------------------------------------------------- NTK family
def test_ntk_test_vector():
    # methods.md 3: d=128, b=1e4, alpha=8 -> b' = 82684.62; 4.2: t=29 -> 305,922; t=57 -> 607,779
    assert 1e4 * 8 ** (128 / 126) == pytest.approx(82684.62, abs=0.01)
    assert 1e4 * 29 ** (128 / 126) == pytest.approx(305922, rel=1e-5)
    assert 1e4 * 57 ** (128 / 126) == pytest.approx(607779, rel=1e-5)


@pytest.mark.parametrize("kind", list(MODELS))
def test_ntk_frozen_table8(kind):
    model = MODELS[kind]()
    apply("ntk_frozen", model)
    base, d = dims(model)
    for mult, t in zip((1, 2, 4, 8, 16), (1, 3, 7, 15, 31)):  # Table 8, NTK-Frozen row
        assert ntk_multiplier(2.0, mult * C, C) == t
        inv, att = rope_at(model, mult * C)
        torch.testing.assert_close(inv, default_inv_freq(base * t ** (d / (d - 2)), d), rtol=1e-6, atol=0)
        assert att == 1.0
        # the lowest frequency is divided by exactly t^(d/(d-2))^((d-2)/d) = t
        assert float(default_inv_freq(base, d)[-1] / inv[-1]) == pytest.approx(t, rel=1e-5)


@pytest.mark.parametrize("kind", ["hd64", "hd128", "phi_partial04"])
def test_ntk_frozen_equals_transformers_dynamic(kind):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = MODELS[kind]()
    ref_cfg = model.config.__class__.from_dict(model.config.to_dict())
    ref_cfg.rope_parameters = {**ref_cfg.rope_parameters, "rope_type": "dynamic", "factor": 2.0}
    apply("ntk_frozen", model)
    for n in (C - 1, C, C + 1, 3 * C, 16 * C):
        ref, ref_att = ROPE_INIT_FUNCTIONS["dynamic"](ref_cfg, None, seq_len=n)
        inv, att = rope_at(model, n)
        torch.testing.assert_close(inv, ref, rtol=1e-6, atol=0)
        assert att == ref_att


def test_ntk_32k_64k_table7_8():
    # NTK-32K: 29 29 29 29 61; NTK-64K (paper): 57 everywhere; LCEG code for 64K: clamp at 16C -> 121
    assert [ntk_multiplier(4, m * C, C, min_len=8 * C) for m in (1, 2, 4, 8, 16)] == [29, 29, 29, 29, 61]
    assert [ntk_multiplier(8, m * C, C, 8 * C, 8 * C) for m in (1, 2, 4, 8, 16)] == [57] * 5
    assert ntk_multiplier(8, 16 * C, C, min_len=16 * C) == 121
    for name, ts in (("ntk_32k", [29, 29, 29, 29, 61]), ("ntk_64k", [57] * 5)):
        for ctx in (C, 2 * C):  # the YAMLs are in units of C: the same settings on any window, no rescaling
            model = llama(128, ctx=ctx)
            meth = apply(name, model, ctx=ctx)
            base, d = dims(model)
            for m, t in zip((1, 2, 4, 8, 16), ts):
                assert meth.scale_factor(m * ctx, ctx) == t
                torch.testing.assert_close(rope_at(model, m * ctx)[0], default_inv_freq(base * t ** (d / (d - 2)), d))
    model = llama(128)
    apply("ntk_64k", model, min_len=16, max_len=0)  # the LCEG code's clamp (methods.md 4.2): 121 at 16C
    base, d = dims(model)
    torch.testing.assert_close(rope_at(model, 16 * C)[0], default_inv_freq(base * 121 ** (d / (d - 2)), d))


def test_ntk_dynamic_yaml_values():
    from harness.conf_utils import group_defaults

    y32, y64 = group_defaults("method", "ntk_32k"), group_defaults("method", "ntk_64k")
    assert (y32["factor"], y32["min_len"], y32["max_len"]) == (4.0, 8, 0)  # s = ceil(32k/4k/2) = 4; l >= 8C
    assert (y64["factor"], y64["min_len"], y64["max_len"]) == (8.0, 8, 8)
    assert ntk_multiplier(y32["factor"], 8 * C, C, y32["min_len"] * C) == 29  # Table 7 NTK-32K
    assert ntk_multiplier(y64["factor"], 16 * C, C, y64["min_len"] * C, y64["max_len"] * C) == 57  # Table 7 NTK-64K
    assert METHODS.get("ntk_32k") is METHODS.get("ntk_dynamic") is METHODS.get("ntk_64k")


def test_dynamic_is_stateless_unlike_transformers():
    """transformers' "dynamic" keeps the larger base after a long input (>= C); ours depends on the length only."""
    hf = llama(64)
    hf.config.rope_parameters = {**hf.config.rope_parameters, "rope_type": "dynamic", "factor": 2.0}
    from harness.methods.rope import rebuild_rotary

    rebuild_rotary(hf)
    ours = llama(64)
    apply("ntk_frozen", ours)
    fresh_2c = rope_at(ours, 2 * C)[0]
    rope_at(hf, 16 * C), rope_at(ours, 16 * C)
    hf_after, ours_after = rope_at(hf, 2 * C)[0], rope_at(ours, 2 * C)[0]
    torch.testing.assert_close(ours_after, fresh_2c)
    assert not torch.allclose(hf_after, fresh_2c)  # HF: still the 16C base (order-dependent results)


# ---------------------------------------------------------------------------------------------------- YaRN
def yarn_reference(d, base, c, s, beta_fast=32, beta_slow=1):
    """jquesnelle/yarn LlamaYaRNScaledRotaryEmbedding.yarn(), written from the formulas (methods.md 5.1)."""
    def cdim(r):
        return d * math.log(c / (r * 2 * math.pi)) / (2 * math.log(base))

    low, high = max(math.floor(cdim(beta_fast)), 0), min(math.ceil(cdim(beta_slow)), d - 1)
    if low == high:
        high += 0.001
    theta = default_inv_freq(base, d).double()
    ramp = torch.clamp((torch.arange(d // 2).double() - low) / (high - low), 0, 1)
    mask = 1 - ramp
    inv = theta / s * (1 - mask) + theta * mask
    return inv.float(), (0.1 * math.log(s) + 1 if s > 1 else 1.0), (low, high)


def test_yarn_test_vectors():
    assert yarn_reference(128, 1e4, 4096, 16)[2] == (20, 46)
    assert yarn_reference(128, 5e5, 8192, 16)[2] == (18, 35)
    assert yarn_reference(128, 1e6, 32768, 16)[2] == (23, 40)
    for s, m in ((2, 1.069315), (4, 1.138629), (8, 1.207944), (16, 1.277259), (32, 1.346574)):
        assert yarn_reference(128, 1e4, 4096, s)[1] == pytest.approx(m, abs=1e-6)


@pytest.mark.parametrize("kind", list(MODELS))
@pytest.mark.parametrize("name", ["yarn", "ntk_by_parts"])
def test_yarn_and_ntk_by_parts(kind, name):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = MODELS[kind]()
    base, d = dims(model)
    s = 8.0
    apply(name, model, scale=s)
    ref, ref_att, _ = yarn_reference(d, base, C, s)
    for n in (C // 2, C, 16 * C):  # static: the same at every length
        inv, att = rope_at(model, n)
        torch.testing.assert_close(inv, ref, rtol=1e-6, atol=1e-9)
        assert att == pytest.approx(ref_att if name == "yarn" else 1.0, abs=1e-6)
    # and transformers' "yarn" with the original window given explicitly
    cfg = model.config.__class__.from_dict(model.config.to_dict())
    cfg.rope_parameters = {"rope_type": "yarn", "rope_theta": base, "factor": s,
                           "original_max_position_embeddings": C,
                           **({"partial_rotary_factor": 0.4} if kind.startswith("phi") else {})}
    hf_inv, hf_att = ROPE_INIT_FUNCTIONS["yarn"](cfg)
    torch.testing.assert_close(inv_freq_of(model), hf_inv, rtol=1e-6, atol=0)
    if name == "yarn":
        assert float(model.get_decoder().rotary_emb.attention_scaling) == pytest.approx(hf_att, abs=1e-6)


def test_yarn_ramp_uses_native_window_not_max_position_embeddings():
    """methods.md 16.3: the ramp must use C even if config.max_position_embeddings advertises the target."""
    model = llama(128, ctx=16 * C)
    apply("yarn", model, ctx=C, scale=16.0)
    torch.testing.assert_close(inv_freq_of(model), yarn_reference(128, 1e4, C, 16.0)[0], rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------------------------------------------- ABF, Llama-3
@pytest.mark.parametrize("kind", list(MODELS))
def test_abf(kind):
    model = MODELS[kind]()
    _, d = dims(model)
    apply("abf", model, rope_theta=500000.0)
    torch.testing.assert_close(inv_freq_of(model), default_inv_freq(500000.0, d), rtol=0, atol=0)
    model = MODELS[kind]()
    apply("abf", model, rope_theta=0.0, ratio=5.0)  # the 50,000 variant of a 1e4 model
    torch.testing.assert_close(inv_freq_of(model), default_inv_freq(50000.0, d), rtol=0, atol=0)


def llama3_reference(d, base, c, factor=8.0, low=1.0, high=4.0):
    """meta-llama apply_scaling, per frequency."""
    out, bands = [], [0, 0, 0]
    for f in default_inv_freq(base, d).tolist():
        wl = 2 * math.pi / f
        if wl < c / high:
            out.append(f), bands.__setitem__(0, bands[0] + 1)
        elif wl > c / low:
            out.append(f / factor), bands.__setitem__(2, bands[2] + 1)
        else:
            sm = (c / wl - low) / (high - low)
            out.append((1 - sm) * f / factor + sm * f), bands.__setitem__(1, bands[1] + 1)
    return torch.tensor(out), bands


def test_llama3_test_vector():
    assert llama3_reference(128, 5e5, 8192)[1] == [29, 6, 29]


@pytest.mark.parametrize("kind", list(MODELS))
def test_llama3(kind):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    model = MODELS[kind]()
    base, d = dims(model)
    apply("llama3", model)
    torch.testing.assert_close(inv_freq_of(model), llama3_reference(d, base, C)[0], rtol=1e-6, atol=0)
    cfg = model.config.__class__.from_dict(model.config.to_dict())
    hf, att = ROPE_INIT_FUNCTIONS["llama3"](cfg)
    torch.testing.assert_close(inv_freq_of(model), hf, rtol=1e-6, atol=0)
    assert rope_at(model, 16 * C)[1] == 1.0


# ---------------------------------------------------------------------------------------------------- Entropy-ABF
def test_entropy_scale_formula():
    from harness.methods.entropy_abf import entropy_scale

    pos = torch.tensor([0, 4094, 4095, 4096 ** 2 - 1])
    lam = entropy_scale(pos, 4096)
    assert lam[:3].tolist() == [1.0, 1.0, 1.0]
    assert float(lam[3]) == pytest.approx(2.0, rel=1e-6)


def test_entropy_abf_attention_scales_query_rows():
    import torch.nn.functional as F

    from harness.methods.entropy_abf import entropy_abf_attention, entropy_scale, register_attention

    register_attention("sdpa")
    mod = torch.nn.Module()
    mod.layer_idx, mod.is_causal, mod.num_key_value_groups, mod.training = 2, True, 1, False
    mod._eabf = {"base": "sdpa", "native_ctx": 8, "exempt_layers": 2}
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 40, 16) for _ in range(3))
    pos = torch.arange(40)[None]
    out, _ = entropy_abf_attention(mod, q, k, v, None, position_ids=pos, scaling=0.25, dropout=0.0)
    lam = entropy_scale(pos, 8)[0]
    ref = F.scaled_dot_product_attention(q * lam[None, None, :, None], k, v, is_causal=True, scale=0.25)
    torch.testing.assert_close(out, ref.transpose(1, 2), rtol=1e-5, atol=1e-6)
    mod.layer_idx = 1  # exempt
    out1, _ = entropy_abf_attention(mod, q, k, v, None, position_ids=pos, scaling=0.25, dropout=0.0)
    ref1 = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.25)
    torch.testing.assert_close(out1, ref1.transpose(1, 2), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["hd64", "phi_partial04", "gqa"])
def test_entropy_abf_end_to_end(kind):
    ids = torch.randint(3, 256, (1, 3 * C))
    outs = {}
    for label, kw in (("abf", None), ("paper", {}), ("code", {"scale_all_layers": True})):
        model = {"hd64": lambda: llama(64, layers=3), "phi_partial04": lambda: phi(layers=3),
                 "gqa": lambda: llama(64, heads=4, kv_heads=2, layers=3)}[kind]()
        if kw is None:
            apply("abf", model, rope_theta=500000.0)
        else:
            apply("entropy_abf", model, rope_theta=500000.0, **kw)
        with torch.no_grad():
            outs[label] = model(ids).logits
    # within the native window lambda = 1: identical to ABF
    torch.testing.assert_close(outs["paper"][:, :C - 1], outs["abf"][:, :C - 1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(outs["code"][:, :C - 1], outs["abf"][:, :C - 1], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(outs["paper"][:, C + 1:], outs["abf"][:, C + 1:], atol=1e-4)
    assert not torch.allclose(outs["paper"][:, C + 1:], outs["code"][:, C + 1:], atol=1e-4)


def test_entropy_abf_two_layer_model_paper_is_abf():
    ids = torch.randint(3, 256, (1, 3 * C))
    a, b = llama(64, layers=2), llama(64, layers=2)
    apply("abf", a, rope_theta=500000.0)
    apply("entropy_abf", b, rope_theta=500000.0)  # layers 0 and 1 exempt -> no layer scaled
    with torch.no_grad():
        torch.testing.assert_close(a(ids).logits, b(ids).logits, rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------- LongRoPE
def factors_file(tmp_path, d, s=8, short=None, long=None, **extra):
    long = long or [1.0 + (s - 1) * i / (d // 2 - 1) for i in range(d // 2)]
    data = {"short_factor": short or [1.0] * (d // 2), "long_factor": long,
            "original_max_position_embeddings": C, "max_position_embeddings": s * C, "provenance": {"test": True},
            **extra}
    p = tmp_path / "f.json"
    p.write_text(json.dumps(data))
    return str(p), data


def test_su_mscale_vectors():
    from harness.methods.longrope import su_mscale

    assert su_mscale(32, 4096) == pytest.approx(1.190238, abs=1e-6)
    assert su_mscale(16, 8192) == pytest.approx(1.143544, abs=1e-6)
    assert su_mscale(1, 4096) == 1.0


@pytest.mark.parametrize("kind", list(MODELS))
def test_longrope_matches_transformers_and_switch(kind, tmp_path):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from harness.methods.longrope import su_mscale

    model = MODELS[kind]()
    base, d = dims(model)
    short = [1.0 + 0.01 * i for i in range(d // 2)]
    path, data = factors_file(tmp_path, d, short=short)
    apply("longrope", model, factors=path)
    theta = default_inv_freq(base, d)
    for n, f in ((C - 1, short), (C, short), (C + 1, data["long_factor"]), (16 * C, data["long_factor"])):
        inv, att = rope_at(model, n)
        torch.testing.assert_close(inv, theta / torch.tensor(f), rtol=1e-6, atol=0)
        assert att == pytest.approx(su_mscale(8, C), abs=1e-7)
    cfg = model.config.__class__.from_dict(model.config.to_dict())
    hf, hf_att = ROPE_INIT_FUNCTIONS["longrope"](cfg, None, seq_len=C + 1)
    torch.testing.assert_close(rope_at(model, C + 1)[0], hf, rtol=1e-6, atol=0)
    assert hf_att == pytest.approx(su_mscale(8, C), abs=1e-7)
    # switch=false: the original LongRoPE class (long factors at every length)
    model = MODELS[kind]()
    apply("longrope", model, factors=path, switch=False)
    torch.testing.assert_close(rope_at(model, C // 2)[0], theta / torch.tensor(data["long_factor"]), rtol=1e-6, atol=0)


def test_longrope_n_hat_rows_are_original_rope(tmp_path):
    model = llama(64)
    base, d = dims(model)
    path, _ = factors_file(tmp_path, d, n_hat=4)
    apply("longrope", model, factors=path)
    rot = model.get_decoder().rotary_emb
    pos = torch.arange(3 * C)[None]
    cos, sin = rot(torch.zeros(1, 3 * C, 4), position_ids=pos)
    f = pos[0, :, None].float() * default_inv_freq(base, d)
    emb = torch.cat((f, f), -1)
    torch.testing.assert_close(cos[0, :4], emb.cos()[:4])  # start tokens: original RoPE, no mscale
    torch.testing.assert_close(sin[0, :4], emb.sin()[:4])
    assert not torch.allclose(cos[0, 4:8], emb.cos()[4:8])


def test_longrope_factors_file_checks(tmp_path):
    model = llama(64)
    path, _ = factors_file(tmp_path, 128)  # wrong length for d = 64
    with pytest.raises(ConfigError, match="d/2 = 32"):
        apply("longrope", model, factors=path)
    with pytest.raises(ConfigError, match="not found"):
        apply("longrope", llama(64), factors=str(tmp_path / "missing.json"))


def test_default_factors_file_is_yarn_ramp_initialisation():
    from harness.methods.longrope import DEFAULT_FILE

    data = json.loads(DEFAULT_FILE.read_text())
    assert set(data) >= {"short_factor", "long_factor", "original_max_position_embeddings", "max_position_embeddings",
                         "provenance"}
    assert (data["original_max_position_embeddings"], data["max_position_embeddings"]) == (512, 4096)
    assert "NOT a searched" in data["provenance"]["source"]
    inv, _, _ = yarn_reference(64, 500.0, 512, 8.0)
    lam = torch.tensor(data["long_factor"])
    assert len(lam) == 32 and bool((lam.diff() >= 0).all()) and lam.min() >= 1 and lam.max() <= 8
    # lambda = s*ramp + (1 - ramp): 1 where YaRN extrapolates, s where it interpolates
    theta = default_inv_freq(500.0, 64)
    assert torch.equal(torch.isclose(inv, theta), lam == 1.0)
    assert torch.equal(torch.isclose(inv, theta / 8), lam == 8.0)


# ---------------------------------------------------------------------------------------------------- LongRoPE2
@pytest.mark.parametrize("kind", ["hd128", "phi_partial04"])
def test_longrope2_switch_and_attention_factor(kind, tmp_path):
    model = MODELS[kind]()
    base, d = dims(model)
    path, data = factors_file(tmp_path, d)
    apply("longrope2", model, factors=path)
    theta = default_inv_freq(base, d)
    su = math.sqrt(1 + math.log(8) / math.log(C))
    for n in (C - 1, C):
        inv, att = rope_at(model, n)
        assert torch.equal(inv, theta) and att == pytest.approx(su)  # released code: mscale in both regimes
    inv, att = rope_at(model, C + 1)
    torch.testing.assert_close(inv, theta / torch.tensor(data["long_factor"]), rtol=1e-6, atol=0)
    assert att == pytest.approx(su)
    model = MODELS[kind]()
    apply("longrope2", model, factors=path, short_attention="one")
    inv, att = rope_at(model, C)
    assert torch.equal(inv, theta) and att == 1.0
    assert rope_at(model, C + 1)[1] == pytest.approx(su)


def test_longrope2_short_is_exactly_base_model(tmp_path):
    ids = torch.randint(3, 256, (1, C))
    base_model, m = llama(64, layers=2), llama(64, layers=2)
    path, _ = factors_file(tmp_path, 64)
    apply("longrope2", m, factors=path, short_attention="one")
    with torch.no_grad():
        torch.testing.assert_close(m(ids).logits, base_model(ids).logits, rtol=0, atol=0)


def test_longrope2_mixed_context_window_training_batches(tmp_path):
    model = llama(64, layers=2)
    path, _ = factors_file(tmp_path, 64)
    meth = apply("longrope2", model, factors=path)
    ids = torch.randint(3, 256, (1, 4 * C))
    kinds = []
    for _ in range(4):
        b = meth.train_batch(ids)
        kinds.append("position_ids" in b)
        if "position_ids" in b:
            assert int(b["position_ids"].max()) == C - 1  # -> short (original RoPE) regime
            assert (b["labels"][0, ::C] == -100).all()
            with torch.no_grad():
                packed = model(**{k: v for k, v in b.items() if k != "labels"}).logits
                alone = model(input_ids=ids[:, 2 * C:3 * C]).logits
            # document-causal masking from restarted positions: segment 3 does not see segments 1-2
            torch.testing.assert_close(packed[:, 2 * C:3 * C], alone, rtol=1e-4, atol=1e-4)
            model.train()
            assert torch.isfinite(model(**b).loss)
            model.eval()
    assert kinds == [False, True, False, True]


# ---------------------------------------------------------------------------------------------------- CLEX
@pytest.mark.parametrize("kind", ["hd64", "hd128", "phi_partial04"])
def test_clex_at_init_equals_ntk_2t_minus_1(kind):
    model = MODELS[kind]()
    base, d = dims(model)
    meth = apply("clex", model, time_dt=0.1, max_factor=8)
    rot = model.get_decoder().rotary_emb
    assert not rot.training  # follows the (eval-mode) model it was put into
    rot.exact_ode = True  # integrate the ODE (RK4) instead of the closed form used while W_down == 0
    for n, t in ((C, 1), (C + 1, 2), (3 * C, 3), (8 * C, 8), (16 * C, 8)):  # t = ceil(n / C), clamped at max
        assert rot.scale_for(n) == t
        inv, att = rope_at(model, n)
        alpha = max(1, 2 * t - 1)
        # float32 RK4, as the original (torchdiffeq on float32 tensors): agreement to round-off
        torch.testing.assert_close(inv, default_inv_freq(base * alpha ** (d / (d - 2)), d), rtol=3e-5, atol=0)
        assert att == 1.0
    assert meth.loaded_weights is False


def test_clex_rk4_fine_step_matches_closed_form():
    model = llama(64)
    apply("clex", model, time_dt=0.01, max_factor=3)
    rot = model.get_decoder().rotary_emb
    rot.exact_ode = True
    torch.testing.assert_close(rot.theta(3), default_inv_freq(1e4 * 5 ** (64 / 62), 64), rtol=3e-5, atol=0)


def test_clex_training_positions_and_gradients():
    model = llama(64, layers=1)
    apply("clex", model, time_dt=0.25, max_factor=4)
    rot = model.get_decoder().rotary_emb
    torch.manual_seed(3)
    pos = rot.train_positions(8 * C, 3, "cpu")
    assert pos[0] == 0 and pos[-1] == 8 * C * 3 // 8 - 1 and len(pos) == 8 * C  # the original's endpoints
    assert bool((pos[1:-1].diff() > 0).all()) and float(pos[-2]) <= 3 * C
    model.train()
    torch.manual_seed(1)  # a draw with t > 1
    ids = torch.randint(3, 256, (1, 2 * C))
    for _ in range(6):
        model.zero_grad()
        model(input_ids=ids, labels=ids).loss.backward()
        if rot.ode_down_proj.grad is not None and rot.ode_down_proj.grad.abs().sum() > 0:
            break
    assert rot.ode_down_proj.grad.abs().sum() > 0  # the ODE network is trained through the frequencies


def test_clex_weights_saved_and_reloaded(tmp_path):
    from transformers import AutoModelForCausalLM

    model = llama(64)
    meth = apply("clex", model, time_dt=0.5, max_factor=4)
    rot = model.get_decoder().rotary_emb
    with torch.no_grad():
        rot.ode_down_proj.normal_(0, 0.1)
    trained = rope_at(model, 3 * C)[0]
    model.save_pretrained(tmp_path)
    save_method(tmp_path, meth)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.rope_parameters["rope_type"] == "clex"
    meth2 = build_method({"name": "clex", "time_dt": 0.5, "max_factor": 4})
    check_checkpoint_method(tmp_path, meth2)
    meth2.apply(ModelHandle(loaded, None, "random", C, {"path": str(tmp_path)}))
    assert meth2.loaded_weights
    torch.testing.assert_close(rope_at(loaded, 3 * C)[0], trained)
    with pytest.raises(ConfigError, match="trained or saved with method"):
        check_checkpoint_method(tmp_path, build_method({"name": "clex", "time_dt": 0.5, "max_factor": 8}))


# ---------------------------------------------------------------------------------------------------- KV cache
def greedy_logits_cached(model, ids, prefix):
    """Logits of the last position at every step, prefilling ``prefix`` tokens then decoding one at a time."""
    from transformers import DynamicCache

    dec, head = model.get_decoder(), model.get_output_embeddings()
    cache = DynamicCache()
    out = []
    with torch.no_grad():
        h = dec(input_ids=ids[:, :prefix], past_key_values=cache, use_cache=True,
                position_ids=torch.arange(prefix)[None]).last_hidden_state
        out.append(head(h[:, -1]))
        for i in range(prefix, ids.shape[1]):
            h = dec(input_ids=ids[:, i:i + 1], past_key_values=cache, use_cache=True,
                    position_ids=torch.tensor([[i]])).last_hidden_state
            out.append(head(h[:, -1]))
    return torch.cat(out)


def full_logits(model, ids, prefix):
    with torch.no_grad():
        return torch.cat([model(ids[:, :n]).logits[:, -1] for n in range(prefix, ids.shape[1] + 1)])


def test_hf_dynamic_ntk_stale_cache_bug_25104():
    """transformers' own dynamic NTK: keys cached before the base grew keep their old rotation, so cached decoding
    past C diverges from recomputing the prefix (issue #25104, unfixed by design). Within C they agree."""
    from harness.methods.rope import rebuild_rotary

    model = llama(64, layers=2)
    model.config.rope_parameters = {**model.config.rope_parameters, "rope_type": "dynamic", "factor": 2.0}
    rebuild_rotary(model)
    ids = torch.randint(3, 256, (1, C + 8))
    cached, full = greedy_logits_cached(model, ids, C - 4), full_logits(model, ids, C - 4)
    torch.testing.assert_close(cached[:4], full[:4], rtol=1e-4, atol=1e-4)  # lengths <= C
    assert (cached[5:] - full[5:]).abs().max() > 1e-3  # stale keys past C


CACHE_CASES = {
    "ntk_frozen": dict(),
    "ntk_dynamic": dict(min_len=0),
    "ntk_32k": dict(min_len=2),  # static up to 2C, dynamic beyond
    "clex": dict(time_dt=0.5, max_factor=4),
    "longrope": dict(),
    "longrope2": dict(),
}


@pytest.mark.parametrize("name,kind", [(n, "hd64") for n in CACHE_CASES] + [("ntk_frozen", "gqa"), ("clex", "gqa"),
                                        ("ntk_frozen", "phi_partial04"), ("longrope", "phi_partial04")])
def test_kv_cache_refresh_equals_full_recompute(name, kind, tmp_path):
    """One layer: its keys/values depend on the embeddings only, so re-rotating the cached keys (the pre-RoPE key
    cache of CLEX) makes cached decoding *equal* to recomputing the whole prefix at the new length. (Deeper layers'
    cached K/V were computed from attention outputs under the older frequencies: see the next test.)"""
    model = {"hd64": lambda: llama(64, layers=1), "gqa": lambda: llama(64, heads=4, kv_heads=2, layers=1),
             "phi_partial04": lambda: phi(layers=1)}[kind]()
    _, d = dims(model)
    kw = dict(CACHE_CASES[name])
    if name.startswith("longrope"):
        kw["factors"] = factors_file(tmp_path, d, n_hat=3 if name == "longrope" else 0)[0]
    apply(name, model, **kw)
    if name == "clex":
        with torch.no_grad():
            model.get_decoder().rotary_emb.ode_down_proj.normal_(0, 0.05)  # a "trained" CLEX
    ids = torch.randint(3, 256, (1, 2 * C + 6))
    prefix = C - 3  # decoding crosses C (and 2C)
    cached, full = greedy_logits_cached(model, ids, prefix), full_logits(model, ids, prefix)
    torch.testing.assert_close(cached, full, rtol=2e-4, atol=2e-4)


def test_kv_cache_refresh_multilayer_closer_than_stale():
    """With several layers, refresh = every cached key at the current frequencies (CLEX's pre-RoPE cache semantics);
    earlier tokens' hidden states are not recomputed, so it is closer to, not equal to, a full recompute."""
    errs = {}
    for mode in ("refresh", "stale"):
        model = llama(64, layers=2)
        apply("ntk_frozen", model, kv_cache=mode)
        torch.manual_seed(1)
        ids = torch.randint(3, 256, (1, C + 12))
        errs[mode] = (greedy_logits_cached(model, ids, C - 3) - full_logits(model, ids, C - 3)).abs().max()
    assert errs["refresh"] < errs["stale"] / 2


def test_kv_cache_stale_mode_reproduces_transformers():
    """kv_cache: stale decodes exactly as transformers' own "dynamic" rope type does (same weights, same cache, keys
    rotated with the base of the step that cached them, #25104), and both differ from a full recompute past C."""
    from harness.methods.rope import rebuild_rotary

    model = llama(64, layers=2)
    apply("ntk_frozen", model, kv_cache="stale")
    hf = llama(64, layers=2)  # the same seeded weights
    hf.config.rope_parameters = {**hf.config.rope_parameters, "rope_type": "dynamic", "factor": 2.0}
    rebuild_rotary(hf)
    ids = torch.randint(3, 256, (1, C + 8))
    cached, full = greedy_logits_cached(model, ids, C - 4), full_logits(model, ids, C - 4)
    torch.testing.assert_close(cached, greedy_logits_cached(hf, ids, C - 4), rtol=1e-5, atol=1e-5)
    assert (cached[5:] - full[5:]).abs().max() > 1e-3


def test_rerotate_keys_composes_rotations():
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    torch.manual_seed(0)
    k = torch.randn(1, 2, 10, 16)
    old, new = default_inv_freq(1e4, 16), default_inv_freq(3e4, 16)

    def rot(inv, att):
        f = torch.arange(10)[:, None].float() * inv
        e = torch.cat((f, f), -1)
        return apply_rotary_pos_emb(k, k, (e.cos() * att)[None], (e.sin() * att)[None])[1]

    a = rot(old, 1.1).clone()
    rerotate_keys(a, old, 1.1, new, 1.3)
    torch.testing.assert_close(a, rot(new, 1.3), rtol=1e-5, atol=1e-5)


# ---------------------------------------------------------------------------------------------------- all methods
ALL = ["ntk_frozen", "ntk_dynamic", "ntk_32k", "ntk_64k", "yarn", "ntk_by_parts", "abf", "entropy_abf", "longrope",
       "longrope2", "clex", "llama3"]


@pytest.mark.parametrize("name", ALL)
def test_every_method_registered_runs_and_saves_params(name, tmp_path):
    from harness.conf_utils import group_defaults

    assert name in METHODS
    node = group_defaults("method", name)
    assert node["name"] == name
    meth = build_method(node)
    model = random_llama(hidden=256, heads=4, layers=1, ctx=512, theta=500.0)  # tiny_llama's RoPE geometry
    meth.apply(ModelHandle(model, None, "random", 512, {}))
    with torch.no_grad():
        out = model(torch.randint(3, 256, (1, 600))).logits
    assert torch.isfinite(out).all()
    save_method(tmp_path, meth)
    check_checkpoint_method(tmp_path, build_method(node))  # same parameters: accepted
    other = dict(node)
    key = next(k for k, v in node.items() if isinstance(v, float) and k != "name")
    other[key] = node[key] + 1.0
    with pytest.raises(ConfigError):
        check_checkpoint_method(tmp_path, build_method(other))
