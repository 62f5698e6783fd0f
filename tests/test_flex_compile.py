"""The fused attention backend as CUDA runs it -- ``torch.compile(flex_attention)`` and ``torch.compile(
create_block_mask)``, once per process (``harness.methods.flex.kernels``) -- under dynamo's own guards, on the CPU:
the CPU stands in as the accelerator (``harness.device.ACCELERATOR``) and the compile backend is ``eager`` with a
counter (the traced graphs run as they are). Prefill, decoding and prefix reuse at several lengths, for several
methods in one process: no compilation after a method's first length, and no call that runs outside a compiled graph
(past ``recompile_limit`` dynamo gives up and every later call runs the unfused flex_attention, which on a GPU
materialises the [B, H, L, L] scores: 32 GiB per call at 16k on LLaMA2-7B). With a mask closure that captures the
query offset as a Python number (the old code), Self-Extend alone hit the limit at its first length."""
from __future__ import annotations

import pytest
import torch

from harness.methods import flex
from tests.conftest import random_llama
from tests.virtual_node import KernelStats

LENGTHS = (40, 100)  # a second length shows whether a length compiles again


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


def test_flex_compiles_once_per_pattern_not_per_length_or_method(cuda_policy_on_cpu):
    from harness.evals.common import PrefixCache, token_nll
    from harness.methods import build_method
    from harness.models import ModelHandle

    stats = cuda_policy_on_cpu
    settings = {"self_extend": {"window": 0.25, "group": 4}, "dca": {"chunk_size": 0.75, "local_window": 0.25},
                "lm_infinite": {}}
    g = torch.Generator().manual_seed(0)
    for name, kw in settings.items():
        model = random_llama(kv_heads=2, ctx=32, layers=1)
        handle = ModelHandle(model, None, "random", 32, {"rotary_dim": 16})
        flex.set_backend(model, "auto")
        build_method({"name": name, **kw}).apply(handle)
        gen = PrefixCache(model, "float32")
        after = []
        for L in LENGTHS:
            ids = torch.randint(3, 250, (L,), generator=g).tolist()
            gen.generate(ids, 2)  # prefill + decoding
            gen.generate(ids[:-3] + [5, 6, 7], 2)  # prefix reuse: a 3-token tail over a cached head
            token_nll(model, torch.randint(3, 250, (2, L), generator=g), chunk=64, dtype="float32")  # batch 2
            after.append(stats.compiles)
        assert stats.kernel_calls > 0, f"{name}: no fused call (the backend did not resolve to flex)"
        assert after[-1] == after[0], f"{name}: compiled again at a later length ({after})"
    assert stats.eager_calls == 0, f"{stats.eager_calls} of {stats.kernel_calls} calls ran outside a compiled graph"
    assert stats.compiles <= torch._dynamo.config.recompile_limit  # both frames together stay under one's limit


def test_a_kernel_past_the_recompile_limit_is_an_error_not_an_unfused_call(cuda_policy_on_cpu):
    """Dynamo's fallback past ``recompile_limit`` (every later call unfused, a warning printed once) is a
    ``KernelFallback`` error naming the inputs: with the limit at 1, batch 1 compiles, batch 2 needs a second graph
    (size 1 is specialised) and raises instead of running unfused."""
    stats = cuda_policy_on_cpu
    attend, _ = flex.kernels(torch.device("cpu"))
    q, q2 = torch.randn(1, 2, 128, 16), torch.randn(2, 2, 128, 16)
    limit = torch._dynamo.config.recompile_limit
    # config.patch, not monkeypatch: monkeypatch's undo deletes the key, which hides it from dynamo for good
    with torch._dynamo.config.patch(recompile_limit=1):
        flex.run_kernel(attend, q, q, q)
        assert stats.compiles == 1
        with pytest.raises(flex.KernelFallback, match=r"recompile_limit \(1 graphs\) at inputs \[\(2, 2, 128, 16\)"):
            flex.run_kernel(attend, q2, q2, q2)  # before: it ran unfused and returned
    assert torch._dynamo.config.recompile_limit == limit  # and the setting is still there for every later compile
