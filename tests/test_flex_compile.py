"""The fused attention backend as CUDA runs it -- ``torch.compile(flex_attention)`` and ``torch.compile(
create_block_mask)``, once per process (``harness.methods.flex.kernels``) -- under dynamo's own guards, on the CPU:
the CPU stands in as the accelerator (``harness.device.ACCELERATOR``) and the compile backend is ``eager`` with a
counter (the traced graphs run as they are). Every inference flex path in one process (Self-Extend, DCA, LM-Infinite,
and ``harness_causal`` for the methods that keep the model's attention) on a LLaMA-2-7B-shaped attention (head dim
128, no GQA) at several multiples of 128 tokens, batch 1 and 2, left padding, and prefix reuse (a query of L/2 over L
keys, a 3-token tail): no compilation after the first length, no call outside a compiled graph (past
``recompile_limit`` dynamo would run the unfused flex_attention, which on a GPU materialises the [B, H, Lq, KV]
scores: ~16 GiB per call at 16k on LLaMA-2-7B; the kernels make that an error, ``KernelFallback``), and the compiled
numbers equal the reference's. Before the kernels canonicalised their inputs (contiguous q/k/v, no tensor captured
twice, no duck sizing, size-oblivious batch), Self-Extend alone reached the limit at its first length here.
LongLoRA's S2 mask runs only with gradients (training), which CPU flex cannot do: not covered here."""
from __future__ import annotations

import pytest
import torch

from harness.methods import flex
from tests.conftest import random_llama
from tests.virtual_node import KernelStats

C = 256  # the native window of the test model
LENGTHS = (256, 640, 1152)  # 1C, 2.5C, 4.5C: multiples of 128 (flex's block), several blocks each
FLEX_METHODS = {"self_extend": {"window": 0.25, "group": 4}, "dca": {"chunk_size": 0.75, "local_window": 0.25},
                "lm_infinite": {}, "base": {}}  # base under backend=flex: harness_causal (reuse, padding)


@pytest.fixture
def cuda_policy_on_cpu(monkeypatch):
    import harness.device

    torch._dynamo.reset()  # dynamo's cache is per code object: nothing left from another test or backend
    stats = KernelStats()
    monkeypatch.setattr(harness.device, "ACCELERATOR", "cpu")
    monkeypatch.setattr(flex, "KERNEL_BACKEND", stats.backend)
    real = flex.run_kernel

    def counted(fn, *args, **kwargs):
        stats.kernel_calls += 1
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(flex, "run_kernel", counted)
    yield stats
    torch._dynamo.reset()


def _padded_nll(model, ids: torch.Tensor, pad: int) -> torch.Tensor:
    """Logits of a batch whose first row is left-padded by ``pad`` tokens (2-D padding mask)."""
    mask = torch.ones_like(ids)
    mask[0, :pad] = 0
    with torch.inference_mode():
        return model(input_ids=ids, attention_mask=mask).logits[:, pad:].float()


def test_every_flex_path_compiles_a_bounded_set_of_graphs_at_paper_like_shapes(cuda_policy_on_cpu):
    from harness.evals.common import PrefixCache, token_nll
    from harness.methods import build_method
    from harness.models import ModelHandle

    stats = cuda_policy_on_cpu
    g = torch.Generator().manual_seed(0)
    for name, kw in FLEX_METHODS.items():
        model = random_llama(vocab=256, hidden=256, heads=2, head_dim=128, ctx=C, layers=1)  # 7B's head shape
        handle = ModelHandle(model, None, "random", C, {"rotary_dim": 128})
        flex.set_backend(model, "flex" if name == "base" else "auto")
        build_method({"name": name, **kw}).apply(handle)
        gen = PrefixCache(model, "float32")
        after = []
        for L in LENGTHS:
            ids = torch.randint(3, 250, (L,), generator=g).tolist()
            gen.generate(ids, 2)  # prefill + decoding
            gen.generate(ids[: L // 2] + torch.randint(3, 250, (L - L // 2,), generator=g).tolist(), 2)  # L/2 over L
            gen.generate(ids[:-3] + [5, 6, 7], 2)  # a 3-token tail over a cached head
            token_nll(model, torch.randint(3, 250, (1, L), generator=g), chunk=512, dtype="float32")  # batch 1
            batch = torch.randint(3, 250, (2, L), generator=g)
            token_nll(model, batch, chunk=512, dtype="float32")  # batch 2
            fused = _padded_nll(model, batch, pad=L // 4)  # batch 2, left padding
            after.append(stats.compiles)
        assert stats.kernel_calls > 0, f"{name}: no fused call (the backend did not resolve to flex)"
        assert after[-1] == after[0], f"{name}: compiled again at a later length ({after})"
        if name != "base":  # the compiled graphs compute what the reference computes (batch 2, padding, 4.5C)
            flex.set_backend(model, "reference")
            ref = _padded_nll(model, batch, pad=LENGTHS[-1] // 4)
            torch.testing.assert_close(fused, ref, atol=2e-4, rtol=2e-4)
    assert stats.eager_calls == 0, f"{stats.eager_calls} of {stats.kernel_calls} calls ran outside a compiled graph"
    assert stats.compiles <= torch._dynamo.config.recompile_limit  # both frames together stay under one's limit


def test_a_kernel_past_the_recompile_limit_is_an_error_not_an_unfused_call(cuda_policy_on_cpu):
    """Dynamo's fallback past ``recompile_limit`` (every later call unfused, a warning printed once) is a
    ``KernelFallback`` error naming the inputs: with the limit at 1, a float32 call compiles, a float64 one needs a
    second graph (dynamo guards on the dtype) and raises instead of running unfused."""
    stats = cuda_policy_on_cpu
    attend, _ = flex.kernels(torch.device("cpu"))
    q, q2 = torch.randn(1, 2, 128, 16), torch.randn(2, 2, 128, 16, dtype=torch.float64)
    limit = torch._dynamo.config.recompile_limit
    # config.patch, not monkeypatch: monkeypatch's undo deletes the key, which hides it from dynamo for good
    with torch._dynamo.config.patch(recompile_limit=1):
        flex.run_kernel(attend, q, q, q)
        assert stats.compiles == 1
        with pytest.raises(flex.KernelFallback, match=r"recompile_limit \(1 graphs\) at inputs \[\(2, 2, 128, 16\)"):
            flex.run_kernel(attend, q2, q2, q2)  # before: it ran unfused and returned
    assert torch._dynamo.config.recompile_limit == limit  # and the setting is still there for every later compile
