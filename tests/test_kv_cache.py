"""The KV cache of greedy decoding (``evals.common.GrowingCache``, used by ``PrefixCache`` / ``greedy_generate`` and
so by every generating evaluator): pre-allocated buffers written in place, views of exactly the filled length.

Checked against transformers' ``DynamicCache`` (``torch.cat`` every step) for every registered method on a small
random Llama with prompts past its native window (where Self-Extend, LM-Infinite, StreamingLLM, Landmark and DCA run
their own attention over the cached keys): same greedy tokens, same logits; the buffer a layer's keys live in does
not move while decoding; crop + reuse equals a fresh encode."""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from conftest import random_llama
from transformers import DynamicCache

from harness.evals.common import PrefixCache, greedy_generate
from harness.methods import build_method
from harness.models import ModelHandle

CTX = 64
ROOT = Path(__file__).resolve().parents[1]
METHOD_NAMES = sorted(p.stem for p in (ROOT / "conf" / "method").glob("*.yaml"))


class LandmarkTok:
    """Stands in for a tokenizer that already has <landmark> (tiny_llama's does)."""

    def get_vocab(self):
        return {"<landmark>": 5}

    def convert_tokens_to_ids(self, t):
        return 5


_BASE = {}


def method_model(name: str, tmp_path: Path):
    if "model" not in _BASE:
        _BASE["model"] = random_llama(kv_heads=2, ctx=CTX, head_dim=64)  # d = 64: LongRoPE's shipped factors fit
    model = copy.deepcopy(_BASE["model"])
    kw = {}
    if name in ("longrope", "longrope2"):  # the shipped tiny_llama factors (C = 512 -> 4096) restated for C = 64
        fac = json.loads((ROOT / "harness/assets/longrope/tiny_llama_512_4096.json").read_text())
        fac.update(original_max_position_embeddings=CTX, max_position_embeddings=8 * CTX)
        kw["factors"] = str(tmp_path / "factors.json")
        Path(kw["factors"]).write_text(json.dumps(fac))
    method = build_method({"name": name, **kw})
    handle = ModelHandle(model, LandmarkTok(), "random", CTX, {})
    method.apply(handle)
    method.eval_mode(handle)
    return model


def prompt(n: int, seed: int = 1) -> list[int]:
    return torch.randint(6, 250, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


class Recorder:
    """Forward hooks (no change to what runs): the LM head's last logits and, per decoder call, the storage pointer
    and length of layer 0's cached keys."""

    def __init__(self, model):
        self.logits, self.ptrs, self.lens = [], [], []
        self.h1 = model.get_output_embeddings().register_forward_hook(
            lambda m, a, out: self.logits.append(out[0, -1].float().clone()))
        self.h2 = model.get_decoder().register_forward_hook(self._dec, with_kwargs=True)

    def _dec(self, module, args, kwargs, out):
        layer = kwargs["past_key_values"].layers[0]
        self.ptrs.append(layer.keys.untyped_storage().data_ptr())
        self.lens.append(layer.keys.shape[-2])

    def close(self):
        self.h1.remove()
        self.h2.remove()


@torch.inference_mode()
def dynamic_reference(model, ids: list[int], steps: int):
    """Greedy decoding with transformers' DynamicCache, the loop ``PrefixCache`` ran before: (tokens, logits)."""
    dec, head = model.get_decoder(), model.get_output_embeddings()
    cache, out, logits = DynamicCache(), [], []
    h = dec(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True,
            position_ids=torch.arange(len(ids))[None])
    for i in range(steps):
        last = head(h.last_hidden_state[:, -1:])[0, -1].float()
        logits.append(last)
        out.append(int(last.argmax()))
        if i == steps - 1:
            break
        h = dec(input_ids=torch.tensor([[out[-1]]]), past_key_values=cache, use_cache=True,
                position_ids=torch.tensor([[len(ids) + i]]))
    return out, torch.stack(logits)


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_same_greedy_tokens_as_dynamic_cache_and_no_copy_per_token(name, tmp_path):
    model = method_model(name, tmp_path)
    ids, steps = prompt(3 * CTX + 7), 12
    want, want_logits = dynamic_reference(model, ids, steps)
    rec = Recorder(model)
    try:
        got = greedy_generate(model, torch.tensor([ids]), steps, dtype="float32")
    finally:
        rec.close()
    assert got == want
    torch.testing.assert_close(torch.stack(rec.logits), want_logits, rtol=0, atol=1e-5)
    # every decoding step (all calls after the prefill) wrote into the buffer the prefill left: no re-allocation
    assert len(rec.ptrs) == steps and rec.lens[-1] >= len(ids) + steps - 1
    assert len(set(rec.ptrs[1:])) == 1, f"{name}: layer 0's keys moved during decoding"


def test_buffer_is_written_in_place_and_returns_the_filled_length(small_llama):
    """Without a method: the keys returned are exactly the filled part of the layer's pre-allocated buffer."""
    from harness.evals.common import GrowingCache

    ids, steps = prompt(40), 10
    cache = GrowingCache(capacity=len(ids) + steps)
    dec = small_llama.get_decoder()
    with torch.inference_mode():
        dec(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        layer = cache.layers[0]
        base = layer.keys.untyped_storage().data_ptr()
        assert layer._k.shape[-2] == len(ids) + steps and layer.keys.shape[-2] == len(ids)
        for i in range(steps):
            dec(input_ids=torch.tensor([[7 + i]]), past_key_values=cache, use_cache=True,
                position_ids=torch.tensor([[len(ids) + i]]))
            assert layer.keys.untyped_storage().data_ptr() == base
            assert cache.get_seq_length() == layer.keys.shape[-2] == layer.values.shape[-2] == len(ids) + i + 1


def test_growth_past_the_capacity_doubles_and_keeps_the_contents(small_llama):
    from harness.evals.common import GrowingCache

    ids = prompt(30)
    ref, grown = DynamicCache(), GrowingCache(capacity=8)  # far too small: grows during prefill and decoding
    dec = small_llama.get_decoder()
    with torch.inference_mode():
        for c in (ref, grown):
            dec(input_ids=torch.tensor([ids]), past_key_values=c, use_cache=True)
        caps = [grown.layers[0]._k.shape[-2]]
        for i in range(40):
            for c in (ref, grown):
                dec(input_ids=torch.tensor([[9 + i]]), past_key_values=c, use_cache=True,
                    position_ids=torch.tensor([[len(ids) + i]]))
            caps.append(grown.layers[0]._k.shape[-2])
    assert caps[0] == 30 and sorted(set(caps)) == [30, 60, 120]  # the prefill's need, then doubling
    for a, b in zip(ref.layers, grown.layers):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)


def test_crop_and_reuse_equal_a_fresh_encode(small_llama):
    """A cache cropped back to a shared prefix and continued with another tail holds exactly what a fresh encode
    of the whole second prompt holds, in the same buffer; ``PrefixCache`` reuse gives the same greedy tokens."""
    from harness.evals.common import GrowingCache

    a = prompt(60, seed=2)
    b = a[:45] + prompt(20, seed=3)
    dec = small_llama.get_decoder()
    with torch.inference_mode():
        reused = GrowingCache(capacity=100)
        dec(input_ids=torch.tensor([a]), past_key_values=reused, use_cache=True)
        ptr = reused.layers[0].keys.untyped_storage().data_ptr()
        reused.crop(-(len(a) - 45))
        assert reused.get_seq_length() == 45
        h_reused = dec(input_ids=torch.tensor([b[45:]]), past_key_values=reused, use_cache=True,
                       position_ids=torch.arange(45, len(b))[None]).last_hidden_state
        fresh = DynamicCache()
        h_fresh = dec(input_ids=torch.tensor([b]), past_key_values=fresh, use_cache=True).last_hidden_state
    assert reused.layers[0].keys.untyped_storage().data_ptr() == ptr
    for x, y in zip(reused.layers, fresh.layers):
        torch.testing.assert_close(x.keys, y.keys, rtol=0, atol=1e-6)
        torch.testing.assert_close(x.values, y.values, rtol=0, atol=1e-6)
    torch.testing.assert_close(h_reused[0, -1], h_fresh[0, -1], rtol=0, atol=1e-5)

    pc = PrefixCache(small_llama, "float32")
    for p in (a, b, b[:50], a):
        assert pc.generate(p, 6) == greedy_generate(small_llama, torch.tensor([p]), 6, dtype="float32")
    assert pc.tokens_reused > 0
