"""The EMA of the weights (``harness.train.ema``): the base model's share the row records is what the update
leaves, bias correction removes it (Adam's corrected average), both engines update alike, and a resumed run keeps
the update count that bias correction depends on."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from conftest import random_llama

from harness.methods import Method, MethodArgs
from harness.models import ModelHandle
from harness.train import TrainArgs
from harness.train.checkpoint import load_state, save_state
from harness.train.deepspeed_engine import partition
from harness.train.ema import EMA, base_share, record
from harness.train.loop import finetune


def _scalar_ema(decay: float, bias_correction: bool, base: float, iterates) -> float:
    """The harness's EMA of a one-parameter model that starts at ``base`` and takes the values ``iterates``."""
    m = torch.nn.Linear(1, 1, bias=False).double()
    with torch.no_grad():
        m.weight.fill_(base)
    ema = EMA(m, decay, bias_correction)
    for x in iterates:
        with torch.no_grad():
            m.weight.fill_(x)
        ema.update()
    return ema.shadow["weight"].item()


@pytest.mark.parametrize("decay,steps", [(0.999, 953), (0.999, 476), (0.9, 20), (0.5, 3)])
def test_base_share_is_what_the_uncorrected_update_leaves(decay, steps):
    """Fine-tuned iterates all 0, base 1: what remains is the base's weight, decay^steps, both by a plain
    recurrence and by the harness's update."""
    direct = 1.0
    for _ in range(steps):
        direct = decay * direct + (1 - decay) * 0.0
    assert base_share(decay, steps, False) == pytest.approx(direct, rel=1e-9)
    assert _scalar_ema(decay, False, 1.0, [0.0] * steps) == pytest.approx(direct, rel=1e-4)  # fp32 shadow
    assert base_share(decay, steps, True) == 0.0
    assert _scalar_ema(decay, True, 1.0, [0.0] * steps) == 0.0


def test_bias_corrected_average_is_adams_and_ignores_the_base():
    """With bias correction the average is (1-d)/(1-d^T) sum_t d^(T-t) x_t (Adam's m_T / (1 - d^T), m_0 = 0):
    the same whatever the base weights were; without it the base shifts it by base_share x base."""
    d, xs = 0.9, np.random.default_rng(0).normal(size=25).tolist()
    m = 0.0
    for x in xs:
        m = d * m + (1 - d) * x
    adam = m / (1 - d ** len(xs))
    for base in (0.0, 5.0):
        assert _scalar_ema(d, True, base, xs) == pytest.approx(adam, abs=1e-5)
        assert _scalar_ema(d, False, base, xs) == pytest.approx(m + d ** len(xs) * base, abs=1e-5)
    assert _scalar_ema(0.0, False, 5.0, xs) == pytest.approx(xs[-1])  # decay 0: the last iterate, as no EMA


def test_the_record_names_decay_correction_steps_and_base_share():
    ema = EMA(torch.nn.Linear(2, 2), 0.5, bias_correction=False)
    for _ in range(3):
        ema.update()
    assert record(ema) == {"decay": 0.5, "bias_correction": False, "steps": 3, "base_share": 0.125}
    assert record(None) is None


def test_both_engines_update_alike():
    """The one EMA over the ZeRO engine's partitions (``local=partition``, here unpartitioned tensors) equals the
    single engine's, step by step, with bias correction."""
    torch.manual_seed(0)
    m = torch.nn.Linear(3, 2, bias=False)
    single, part = EMA(m, 0.8, True), EMA([("weight", m.weight)], 0.8, True, local=partition)
    for _ in range(4):
        with torch.no_grad():
            m.weight.add_(torch.randn_like(m.weight))
        single.update()
        part.update()
        assert torch.equal(single.shadow["weight"], part.shadow["weight"])
    assert record(part) == record(single)


def test_partition_ema_checkpoint_state_round_trips(tmp_path):
    """A rank's EMA state (shadow and update count) through a checkpoint file (tensors + JSON)."""
    m = torch.nn.Linear(3, 2, bias=False)
    part = EMA(m, 0.8, True, local=partition)
    part.update()
    part.update()
    save_state(tmp_path, "rank0", {"ema": part.state_dict()})
    back = EMA(m, 0.8, True, local=partition)
    back.load_state_dict(load_state(tmp_path, "rank0")["ema"])
    assert back.steps == 2 and torch.equal(back.shadow["weight"], part.shadow["weight"])


def _chunks(n=32, L=32, vocab=256, seed=0):
    rng = np.random.default_rng(seed)
    return np.repeat(rng.integers(3, vocab, size=(n, L // 4)), 4, axis=1).astype(np.uint16)


def _run(ckpt, steps: int, **kw):
    a = TrainArgs(name="t", enabled=True, seq_len=32, tokens=32 * 4 * steps, global_batch=4, micro_batch=1, lr=3e-3,
                  warmup_steps=2, ema=True, ema_decay=0.5, ema_bias_correction=True, save_every=2, seed=0,
                  grad_clip=1.0, **kw)
    model = random_llama(vocab=256, seed=1)
    info = finetune(ModelHandle(model, None, "rand", 64), Method(MethodArgs(name="base")), _chunks(), a, ckpt, "fp")
    return model, info


def test_resume_keeps_the_ema_update_count(tmp_path):
    """A run resumed from its step-2 checkpoint ends with the uninterrupted run's bias-corrected EMA: the update
    count comes back with the shadow (restarting it at 0 would make update 3 replace the average)."""
    _run(tmp_path / "ck", 3, keep_checkpoints=True)  # leaves step_2
    resumed, info = _run(tmp_path / "ck", 6)
    assert info["resumed_from_step"] == 2
    reference, ref_info = _run(tmp_path / "fresh", 6)
    assert info["ema"] == ref_info["ema"] == {"decay": 0.5, "bias_correction": True, "steps": 6, "base_share": 0.0}
    for (n, p), (_, q) in zip(resumed.named_parameters(), reference.named_parameters()):
        assert torch.equal(p, q), n
