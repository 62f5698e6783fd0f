"""Host synchronisations under the virtual node (``tests/virtual_node.py``: ``SYNCS`` counts every read of a device
value on the host -- ``.item()``, ``int()``, ``bool()``, ``torch.equal``, ``.cpu()``, ``.tolist()`` -- and every op
whose output size depends on the values): per prompt (prefill with prefix reuse + greedy decoding of 8 tokens with
stop tokens to look for) and per training step (the single engine's loop), for the methods with a fused path and the
RoPE methods, with the attention backend a CUDA node resolves (``auto``: flex). A prompt's count does not grow with
the layers (1 and 2 layers); on 2 layers a prompt costs at most 4 (the 8 generated tokens, read once per
``STOP_CHECK`` = 4, and the forward's own checks: whether position ids restart, transformers' padding-mask check) and
a training step at most 2 (the loss, ``harness.train.step``, and whether position ids restart). Before (issue 56),
on 2 layers: Self-Extend 52 per prompt and 31 per training step, LM-Infinite 86 and 23, DCA 66 and 31, the base 22
and 3, each growing with the layers (a block-mask cache that compared its tensors with ``torch.equal`` per layer, a
read of the farthest distance per layer, one read per generated token). Landmark is not held to it: its block
insertion and retrieval read lengths and block counts by design (36 per prompt on 2 layers)."""
from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
import torch

from harness.conf_utils import group_defaults
from harness.evals.common import STOP_CHECK
from tests.test_device import C, small_tiny
from tests.test_device import tiny_tokenizer as tiny_tokenizer  # the fixture, shared
from tests.virtual_node import SYNCS, to_accelerator

METHODS = ("base", "self_extend", "lm_infinite", "dca")  # base: harness_causal, as every RoPE method
pytestmark = pytest.mark.integration  # the fine-tuning loop runs


def _counts(name: str, tokenizer, layers: int, train: bool = True) -> tuple[int, int | None]:
    """(host syncs per prompt, per training step or None) of ``name`` on a model of ``layers`` layers."""
    from harness.evals.common import PrefixCache
    from harness.methods import build_method
    from harness.methods.flex import set_backend
    from harness.train import TrainArgs, loop

    handle = small_tiny(tokenizer, layers)
    to_accelerator(handle.model)
    set_backend(handle.model, "auto")
    method = build_method(group_defaults("method", name))
    method.apply(handle)
    g = torch.Generator().manual_seed(1)
    head = torch.randint(5, 4000, (2 * C - 40,), generator=g).tolist()
    prompts = [head + torch.randint(5, 4000, (40,), generator=g).tolist() for _ in range(3)]
    gen = PrefixCache(handle.model, "float32")
    gen.generate(prompts[0], 8, stop_ids=(1,))  # the first prompt compiles and encodes the shared head
    SYNCS.reset()
    for p in prompts[1:]:
        gen.generate(p, 8, stop_ids=(1,))
    prompt = SYNCS.syncs / 2
    if not train:
        return prompt, None
    a = TrainArgs(name="syncs", enabled=True, seq_len=C, tokens=C, global_batch=1, micro_batch=1, lr=1e-4,
                  warmup_steps=1, save_every=0, autocast="float32", convergence_check=False)
    chunks = np.random.default_rng(0).integers(5, 4000, (2, C)).astype(np.int64)
    steps = []
    for n in (1, 2):
        a.tokens = n * C
        SYNCS.reset()
        with tempfile.TemporaryDirectory() as d:
            loop.finetune(handle, method, chunks[:n], a, Path(d), "syncs")
        steps.append(SYNCS.syncs)
    return prompt, steps[1] - steps[0]


@pytest.mark.parametrize("name", METHODS)
def test_host_syncs_per_prompt_and_step_do_not_grow_with_the_layers(name, tiny_tokenizer, virtual_node):
    with virtual_node:
        one, two = _counts(name, tiny_tokenizer, 1, train=False), _counts(name, tiny_tokenizer, 2)
    assert one[0] == two[0], f"{name}: host syncs per prompt grow with the layers: {one[0]} -> {two[0]}"
    assert two[0] <= 2 + 8 / STOP_CHECK and two[1] <= 2, f"{name}: {two} host syncs per prompt and per training step"
