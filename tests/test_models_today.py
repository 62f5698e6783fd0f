"""Today's models (conf/model/{llama3_1_8b,qwen2_5_7b,mistral_7b}.yaml): every registered method composes and runs one
forward on tiny random Llama-3.1-style (GQA, ``llama3`` rope scaling already in the config), Qwen2 and Mistral
(sliding window) models; a config's rope scaling is replaced (and recorded) or kept (and recorded), never silently,
and a rope scaling a blocked-attention method cannot keep is refused with one line."""
from __future__ import annotations

import json

import pytest
import torch
from omegaconf import OmegaConf

from harness.conf_utils import CONF_DIR, compose
from harness.config import ConfigError
from harness.methods import build_method, check_checkpoint_method, save_method
from harness.models import ModelHandle

C = 32  # the tiny models' native window
METHODS = sorted(p.stem for p in (CONF_DIR / "method").glob("*.yaml"))
BLOCKWISE = {"self_extend", "lm_infinite", "dca", "streaming_llm", "string", "landmark"}  # _blockwise.install
KEEP_ROPE = BLOCKWISE | {"base", "llama3"}  # llama3: the same scaling the Llama-3.1 config already has
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": C}


def _common(vocab):
    return dict(vocab_size=vocab, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=3)


def llama31(vocab, rope=None):
    from transformers import LlamaConfig, LlamaForCausalLM

    return LlamaForCausalLM(LlamaConfig(**_common(vocab), max_position_embeddings=16 * C,
                                        rope_parameters=dict(rope or LLAMA3_ROPE)))


def qwen2(vocab):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**_common(vocab), max_position_embeddings=4 * C,
                                        rope_parameters={"rope_type": "default", "rope_theta": 1e6}))


def mistral(vocab):
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(**_common(vocab), max_position_embeddings=4 * C, sliding_window=C // 2,
                                            rope_parameters={"rope_type": "default", "rope_theta": 1e4}))


ARCHS = {"llama3_1": llama31, "qwen2": qwen2, "mistral": mistral}


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from harness.models.tiny_llama import ASSET_DIR

    return AutoTokenizer.from_pretrained(ASSET_DIR)


def _handle(arch, tokenizer, **kw):
    import copy

    torch.manual_seed(0)
    model = ARCHS[arch](len(tokenizer), **kw).eval()
    model.config._attn_implementation = "sdpa"
    return ModelHandle(model, copy.deepcopy(tokenizer), arch, C, {})  # landmark adds a token to its tokenizer


@pytest.fixture(scope="module")
def factors(tmp_path_factory):
    """A LongRoPE factors file for the tiny models' C and rotary dimension (head dim 16: 8 pairs)."""
    f = tmp_path_factory.mktemp("longrope") / "tiny_32_256.json"
    f.write_text(json.dumps({"short_factor": [1.0] * 8, "long_factor": [1.0 + i for i in range(8)],
                             "original_max_position_embeddings": C, "max_position_embeddings": 8 * C}))
    return str(f)


def _method(name, factors):
    return build_method({"name": name, **({"factors": factors} if name.startswith("longrope") else {})})


def test_the_model_yamls_carry_the_true_windows():
    got = {}
    for m in ("llama3_1_8b", "qwen2_5_7b", "mistral_7b"):
        node = OmegaConf.to_container(compose([f"model={m}", "method=base", "train=none"]).model, resolve=True)
        got[m] = (node["builder"], node["path"], node["native_ctx"], node["name"])
    assert got == {"llama3_1_8b": ("hub", "meta-llama/Llama-3.1-8B", 8192, "llama3_1_8b"),
                   "qwen2_5_7b": ("hub", "Qwen/Qwen2.5-7B", 32768, "qwen2_5_7b"),
                   "mistral_7b": ("hub", "mistralai/Mistral-7B-v0.1", 8192, "mistral_7b")}
    # method=llama3 is the scaling Llama-3.1 ships with (factor 8, bands 1 / 4 on C = 8192): hence C = 8192
    m = OmegaConf.to_container(compose(["model=llama3_1_8b", "method=llama3", "train=none"]).method, resolve=True)
    assert (m["scale"], m["low_freq_factor"], m["high_freq_factor"]) == (8.0, 1.0, 4.0)


@pytest.mark.parametrize("arch", list(ARCHS))
@pytest.mark.parametrize("name", METHODS)
def test_every_method_runs_one_forward_and_records_what_it_did_to_the_config(arch, name, tokenizer, factors):
    h = _handle(arch, tokenizer)
    method = _method(name, factors)
    method.check(C)
    method.apply(h)
    method.eval_mode(h)
    with torch.no_grad():
        logits = h.model(torch.randint(4, 4000, (1, 3 * C))).logits
    assert logits.shape[:2] == (1, 3 * C) and bool(torch.isfinite(logits).all())
    params = method.params()
    rec = params.get("checkpoint_rope")
    if arch == "llama3_1":
        assert rec is not None and rec["rope_parameters"] == LLAMA3_ROPE
        assert rec["action"] == ("unchanged" if name in KEEP_ROPE else "replaced"), rec
        if rec["action"] == "unchanged":
            assert h.model.config.rope_parameters["rope_type"] == "llama3"
    else:
        assert rec is None  # plain RoPE in the config: nothing to record
    window = params.get("checkpoint_attention")
    if arch == "mistral" and name in BLOCKWISE:
        assert window == {"sliding_window": C // 2, "action": "dropped"}
    else:
        assert window is None
    json.dumps(params)  # the row stores it as method_params


def test_llama3_on_llama3_1_keeps_its_exact_frequencies(tokenizer):
    from harness.methods.rope import inv_freq_of

    h = _handle("llama3_1", tokenizer)
    before = inv_freq_of(h.model)
    _method("llama3", "").apply(h)
    assert torch.equal(inv_freq_of(h.model), before)
    h2 = _handle("llama3_1", tokenizer)
    _method("pi", "").apply(h2)  # PI replaces the llama3 bands: every frequency / 8 of the plain ones
    assert not torch.equal(inv_freq_of(h2.model), before)


@pytest.mark.parametrize("rope", [
    {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0, "original_max_position_embeddings": C},
    {"rope_type": "dynamic", "rope_theta": 1e4, "factor": 2.0},
], ids=["yarn", "dynamic"])
@pytest.mark.parametrize("name", sorted(BLOCKWISE))
def test_a_rope_scaling_a_blocked_attention_method_cannot_keep_is_one_line(name, rope, tokenizer):
    h = _handle("llama3_1", tokenizer, rope=rope)
    with pytest.raises(ConfigError) as e:
        build_method({"name": name}).apply(h)
    msg = str(e.value)
    assert "\n" not in msg and msg.startswith(f"method={name}: ") and rope["rope_type"] in msg


def test_the_record_is_not_part_of_a_checkpoint_s_method(tmp_path, tokenizer):
    """A model fine-tuned from Llama-3.1 under PI saves method.json; loading it again under PI must pass although
    the first run's params() carried the llama3 record and the second (before apply) does not."""
    h = _handle("llama3_1", tokenizer)
    first = _method("pi", "")
    first.apply(h)
    assert "checkpoint_rope" in first.params()
    save_method(tmp_path, first)
    assert "checkpoint_rope" not in json.loads((tmp_path / "method.json").read_text())
    check_checkpoint_method(tmp_path, _method("pi", ""))
    check_checkpoint_method(tmp_path, first)
    with pytest.raises(ConfigError):
        check_checkpoint_method(tmp_path, build_method({"name": "pi", "scale": 4.0}))
