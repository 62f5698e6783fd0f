"""``harness.memory`` (issue: NIAH at 128k does not fit one 80 GB GPU): the full memory of one evaluation input,
pinned to hand arithmetic for LLaMA2-7B, and the parameter count checked against a real model."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import random_llama

from harness.memory import GIB, eval_memory, gpus_needed, shape_of

LLAMA2_7B = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32,
             "num_key_value_heads": 32, "intermediate_size": 11008, "vocab_size": 32000,
             "tie_word_embeddings": False}  # meta-llama/Llama-2-7b-hf config.json


def test_llama2_7b_at_128k_by_hand():
    s = shape_of(LLAMA2_7B)
    assert (s["layers"], s["hidden"], s["heads"], s["kv_heads"], s["head_dim"], s["vocab"], s["mlp"]) == \
        (32, 4096, 32, 32, 128, 32000, 11008)
    assert s["params"] == 6_738_415_616  # the published count
    m = eval_memory(s, 131072, itemsize=2, generates=True, gen_tokens=50)
    assert m["weights"] == 2 * 6_738_415_616
    assert m["kv_cache"] == 2 * 32 * 32 * 128 * 131072 * 2 == 64 * GIB
    # the MLP is the layer's peak: 4 hidden-size tensors, activation, up and product (3 x 11008), cos/sin, bf16
    assert m["prefill"] == 131072 * 2 * (4 * 4096 + 3 * 11008 + 2 * 128)
    assert m["total"] == m["weights"] + m["kv_cache"] + m["prefill"]
    assert 88 * GIB < m["total"] < 89 * GIB
    assert m["decode_read"] == 50 * (m["weights"] + m["kv_cache"])
    # on an 80 GiB GPU: the input needs two (weights + cache split, one layer's activations on the active GPU)
    assert gpus_needed(m["total"], 80 * GIB, transient=m["prefill"]) == 2
    assert gpus_needed(m["total"], 141 * GIB, transient=m["prefill"]) == 1  # one H200
    # PPL at the same length keeps no cache: one GPU
    ppl = eval_memory(s, 131072, generates=False)
    assert ppl["kv_cache"] == 0 and ppl["decode_read"] == 0 and gpus_needed(ppl["total"], 80 * GIB) == 1


def test_lm_head_chunk_dominates_short_inputs():
    s = shape_of(LLAMA2_7B)
    m = eval_memory(s, 512, generates=False)  # token_nll: 512 positions x 32000 x (bf16 + fp32 + fp32 log-softmax)
    assert m["prefill"] == 512 * 4096 * 2 + 512 * 32000 * (2 + 4 + 4)
    g = eval_memory(s, 512, generates=True)  # decoding applies the head to one position: the layer dominates
    assert g["prefill"] == 512 * 2 * (4 * 4096 + 3 * 11008 + 2 * 128)


def test_gpus_needed_edges():
    assert gpus_needed(0, 10) == 1 and gpus_needed(10, 10) == 1 and gpus_needed(11, 10) == 2
    assert gpus_needed(31, 10, transient=4) == 5  # (31 - 4) / (10 - 4) = 4.5
    with pytest.raises(ValueError, match="exceed one GPU"):
        gpus_needed(100, 10, transient=12)
    with pytest.raises(ValueError, match="gpu_bytes"):
        gpus_needed(1, 0)


@pytest.mark.parametrize("kw", [dict(), dict(kv_heads=2), dict(head_dim=32, heads=4)])
def test_parameter_count_matches_a_real_model(kw):
    model = random_llama(vocab=300, hidden=64, layers=3, **kw)
    s = shape_of(model.config)
    assert s["params"] == sum(p.numel() for p in model.parameters())
    assert s["kv_heads"] == (kw.get("kv_heads") or s["heads"])


def test_check_fits_counts_every_device_of_the_device_map(monkeypatch):
    """A model spread by ``device_map`` over two GPUs: the free memory of both counts (the weights are already
    there), and the prefill's activations must still fit on one of them."""
    from harness import models
    from harness.config import ConfigError

    model = random_llama(hidden=64, heads=4, layers=2, ctx=64)
    h = models.ModelHandle(model, None, "random", 64, {})
    # per token: KV cache 1 KiB, prefill 2688 bytes (test_window_units); 4096 tokens: 4 MiB + 10.5 MiB = 14.5 MiB
    free = {0: 6 << 20, 1: 11 << 20}
    monkeypatch.setattr(models, "available_memory", lambda d: free[d.index] if d.type == "cuda" else 0)
    with pytest.raises(ConfigError, match="14.5 MiB beyond the weights"):
        models.check_fits(h, 4096, generates=True, key="eval.suite.niah")  # on one device (cpu: 0 free)
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": 1, "lm_head": 1}
    assert models.model_devices(model) == [torch.device("cuda", 0), torch.device("cuda", 1)]
    models.check_fits(h, 4096, generates=True, key="eval.suite.niah")  # 17 MiB free in all, 11 MiB on one: fits
    free[1] = 10 << 20  # 16 MiB in all, but the 10.5 MiB of one layer's activations fit on neither GPU
    with pytest.raises(ConfigError, match=r"eval.suite.niah: an input of 4096 tokens .* 16.0 MiB is free on cuda:0, "
                                          r"cuda:1; use shorter eval lengths or spread the model over more GPUs"):
        models.check_fits(h, 4096, generates=True, key="eval.suite.niah")
    free[1] = 8 << 20  # 14 MiB in all < 14.5 MiB
    with pytest.raises(ConfigError, match="14.0 MiB is free"):
        models.check_fits(h, 4096, generates=True, key="eval.suite.niah")


def test_out_of_memory_inside_an_evaluator_is_one_line_and_a_failed_row(results_env):
    """run.py's stages (start, validate, load + extend, evaluate, fail) on the tiny model with a 2-evaluator suite;
    the decoder raises ``torch.OutOfMemoryError`` (as CUDA's allocator does) on inputs longer than 300 tokens: PPL at
    256 finishes, passkey at 256 finishes, passkey at 512 runs out. The row ends ``failed`` with one line naming the
    entry, the length the model saw and the device; the first evaluator's metrics stay in the row."""
    import re

    from harness import lifecycle, pipeline
    from harness.conf_utils import compose
    from harness.results import read_rows

    cfg = compose(["method=base", "train=none", "eval=quick", "eval.lengths=[256,512]",
                   "eval.suite.ppl_books.lengths=[256]", "eval.suite.ppl_books.samples=1",
                   "eval.suite.passkey.samples=1"])
    assert list(cfg.eval.suite) == ["ppl_books", "passkey"]
    run = lifecycle.start(cfg)
    row = run.row
    seen = []

    def oom_when_long(module, args, kwargs, output):  # the injected failure, not the thing under test
        cache = kwargs.get("past_key_values")  # after the forward: holds this input's tokens too
        n = cache.get_seq_length() if cache is not None else kwargs["input_ids"].shape[-1]
        seen.append(n)
        if n > 300:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
                                         f"capacity of 79.15 GiB of which 1.25 GiB is free. Process has {n} tokens")

    try:
        method, train = pipeline.validate(cfg)
        handle = pipeline.load_and_extend(cfg, method, train)
        h = handle.model.get_decoder().register_forward_hook(oom_when_long, with_kwargs=True)
        with pytest.raises(pipeline.EvalOutOfMemory) as ex:
            pipeline.evaluate(cfg, handle, method, run)
        h.remove()
        line = run.fail(ex.value)
    finally:
        if row.get("status") == "running":
            run.finish(RuntimeError("test did not finish the row"))
        lifecycle.STARTED[:] = [r for r in lifecycle.STARTED if r is not run]  # this process's run.py is over
    n = seen[-1]
    assert 256 < n <= 512
    assert re.fullmatch(rf"eval\.suite\.passkey: out of memory at {n} tokens on cpu \(CUDA out of memory\. Tried to "
                        r"allocate 2\.00 GiB\. GPU 0 has a total capacity of 79\.15 GiB of which 1\.25 GiB is free\); "
                        r"use shorter eval lengths or spread the model over more GPUs \(device_map\)", line), line
    (saved,) = read_rows(results_env / "results")
    assert saved["status"] == "failed" and saved["error"] == line and "\n" not in line
    assert saved["metrics"]["ppl_books"]["ppl"]["256"] > 1.0  # measured before the failure: kept
    assert "passkey" not in saved["metrics"]
    assert not handle.model.get_decoder()._forward_pre_hooks  # the length watch is removed after the loop
    assert "OutOfMemoryError" in (Path(saved["run_dir"]) / "error.log").read_text()  # the traceback: error.log


class _LiveBytes:
    """Peak bytes of live tensor storage created inside the mode (each storage counted once, freed with the tensor
    that created it): what a caching allocator must hold at least."""

    def __init__(self):
        from torch.utils._python_dispatch import TorchDispatchMode

        outer = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                for t in torch.utils._pytree.tree_flatten(out)[0]:
                    if isinstance(t, torch.Tensor):
                        outer.add(t)
                return out

        self.mode, self.live, self.cur, self.peak = Mode(), {}, 0, 0

    def add(self, t):
        import weakref

        key = t.untyped_storage().data_ptr()
        if key and key not in self.live:
            self.live[key] = t.untyped_storage().nbytes()
            self.cur += self.live[key]
            self.peak = max(self.peak, self.cur)
            weakref.finalize(t, self.free, key)

    def free(self, key):
        self.cur -= self.live.pop(key, 0)


@pytest.mark.parametrize("hidden,heads,mlp", [(256, 4, 512), (512, 8, 1024), (128, 2, 1024), (256, 4, 1376)])
def test_prefill_estimate_equals_the_measured_peak_of_a_llama_decoder(hidden, heads, mlp):
    """The prefill formula against transformers' own Llama decoder (SDPA, fp32, inference mode): the peak of live
    activation bytes over a 2-layer forward of 1024 tokens, attention-bound and MLP-bound shapes."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=256, hidden_size=hidden, intermediate_size=mlp, num_hidden_layers=2,
                      num_attention_heads=heads, max_position_embeddings=1024, tie_word_embeddings=False)
    cfg._attn_implementation = "sdpa"
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(3, 250, (1, 1024))
    live = _LiveBytes()
    with torch.inference_mode(), live.mode:
        model.get_decoder()(input_ids=ids, use_cache=False)
    est = eval_memory(shape_of(model.config), 1024, itemsize=4)["prefill"]
    assert live.peak == pytest.approx(est, rel=0.05), (live.peak, est)
