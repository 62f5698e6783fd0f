"""Ulysses sequence parallelism (``train.sequence_parallel``, ``harness.train.zero.sequence``): 2 gloo ranks that
each hold half of one sequence give the loss and gradients of one rank on the whole sequence, for the methods whose
RoPE is static (PI, YaRN) and those whose RoPE depends on the sequence length (LongRoPE's short/long switch,
Dynamic NTK, CLEX's training draw), at 2C; the LM head runs in tiles, never on a rank's whole slice; what cannot
be split is refused in one line."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
import torch
import yaml
from conftest import ROOT, random_llama
from omegaconf import OmegaConf

from harness.config import ConfigError
from harness.methods import build_method
from harness.train import TrainArgs
from harness.train.zero import sequence

C = 64


def _model_dir(tmp):
    from transformers import AutoTokenizer

    d = tmp / "model"
    tok = AutoTokenizer.from_pretrained(ROOT / "harness" / "assets" / "tiny_llama")
    m = random_llama(vocab=len(tok), hidden=32, layers=2, heads=2, ctx=C, seed=3)
    m.config.bos_token_id, m.config.eos_token_id = tok.bos_token_id, tok.eos_token_id
    m.save_pretrained(d)
    tok.save_pretrained(d)
    return d


def _method(name, **over):
    node = yaml.safe_load((ROOT / "conf" / "method" / f"{name}.yaml").read_text())
    return {**node, **over}


@pytest.mark.integration
def test_two_ranks_with_the_sequence_split_give_the_whole_sequences_loss_and_gradients(tmp_path):
    """fp32, 2 ranks x 64 tokens against 1 rank x 128 (2C), micro-batch 2, accumulation 2: loss within 1e-5
    (relative), every gradient within 1e-5 of the largest (measured: ~3e-7). LongRoPE, Dynamic NTK and CLEX read the
    group's length: with each rank's own (rank 0 sees C and picks LongRoPE's short factors) their gradients move by
    more than 1e-3 of the largest (a random model's loss barely moves: ~ln V whatever the RoPE)."""
    from harness.train import deepspeed_engine as de

    factors = tmp_path / "factors.json"
    half = 8  # head dim 16
    factors.write_text(json.dumps({"short_factor": [1.0] * half, "long_factor": [1.0 + 3.0 * i / (half - 1)
                                                                                  for i in range(half)],
                                   "original_max_position_embeddings": C, "max_position_embeddings": 4 * C}))
    methods = {"pi": _method("pi", scale=2.0), "yarn": _method("yarn", scale=2.0),
               "longrope": _method("longrope", factors=str(factors)),
               "ntk_dynamic": _method("ntk_dynamic", min_len=0), "clex": _method("clex", max_factor=4)}
    cfg = {"model": {"name": "tiny_llama", "path": str(_model_dir(tmp_path)), "native_ctx": C,
                     "attn_implementation": "sdpa", "dtype": "float32"},
           "methods": methods,
           "train": {"name": "sp", "enabled": True, "engine": "deepspeed", "world_size": 2, "sequence_parallel": 2,
                     "seq_len": 2 * C, "tokens": 2 * C * 4, "global_batch": 4, "micro_batch": 2,
                     "logits_tile_mib": 1, "autocast": "float32"}}
    spec = de.write_spec(cfg, tmp_path / "ckpt", "fp", tmp_path / "job")
    assert de.run_torchrun(spec, 2, entry=ROOT / "tests" / "sp_ranks.py") == 0
    out = json.loads((tmp_path / "job" / "sp.json").read_text())
    assert sorted(out) == sorted(methods)
    for name, r in out.items():
        assert r["grads"], name  # the same parameters got gradients
        assert abs(r["split"] - r["whole"]) <= 1e-5 * abs(r["whole"]), (name, r)
        assert r["grad_max_diff"] <= 1e-5 * r["grad_max"], (name, r)
        # the LM head in tiles of at most half a slice (1 MiB of fp32 logits: 64 of a 4096-token vocabulary)
        assert sum(r["head_rows"]) == r["slice_tokens"] == 2 * C and max(r["head_rows"]) <= C, (name, r)
    for name, r in out.items():  # with each rank's own length, the length-dependent ones go wrong
        wrong = r["own_length_grad_diff"] > 1e-3 * r["grad_max"]
        assert wrong == (name in ("longrope", "ntk_dynamic", "clex")), (name, r)


class _Heads:
    def __init__(self, heads, kv):
        self.num_attention_heads, self.num_key_value_heads = heads, kv


@pytest.mark.unit
def test_what_cannot_be_split_is_refused_in_one_line():
    def args(**kw):
        base = {"name": "t", "enabled": True, "engine": "deepspeed", "world_size": 8, "sequence_parallel": 8,
                "seq_len": 131072, "tokens": 10**9, "global_batch": 8}
        a = TrainArgs(**{**base, **kw})
        a.validate()
        return a

    pi = build_method(OmegaConf.create(_method("pi")))
    sequence.check(args(), pi, _Heads(32, 32))  # LLaMA-2-7B: 32 heads over 8 ranks
    sequence.check(args(sequence_parallel=3, world_size=3, global_batch=3, seq_len=3 * 4096), pi, _Heads(9, 3))
    with pytest.raises(ConfigError, match=r"9 attention heads do not split over 2 ranks .*\[1, 3, 9\]"):
        sequence.check(args(sequence_parallel=2, world_size=2), pi, _Heads(9, 3))
    with pytest.raises(ConfigError, match="6 KV heads and 4 ranks do not divide one another"):
        sequence.check(args(sequence_parallel=4, world_size=4), pi, _Heads(12, 6))
    for name, why in (("longlora", "shifts half of the heads"), ("landmark", "inserts a landmark token")):
        with pytest.raises(ConfigError, match=f"method={name} .*{why}"):
            sequence.check(args(), build_method(OmegaConf.create(_method(name))), _Heads(32, 32))
    for kw, msg in (({"sequence_parallel": 3}, "does not divide train.world_size=8"),
                    ({"sequence_parallel": 0}, "is not a rank count"),
                    ({"engine": "single"}, "needs train.engine=deepspeed"),
                    ({"seq_len": 131073, "sequence_parallel": 1}, None),
                    ({"seq_len": 131076}, "does not divide train.seq_len=131076")):
        if msg is None:
            args(**kw)
            continue
        with pytest.raises(ConfigError, match=msg):
            args(**kw)
    a = args(world_size=16, global_batch=32)  # 2 sequences in flight, 8 ranks each: accumulation 16
    assert a.data_parallel() == 2 and a.accumulation() == 16


@pytest.mark.slow
def test_zero3_with_the_sequence_split_trains_as_one_rank_does_and_resumes_exactly(tmp_path):
    """The engine end to end (run.py's ``launch``): ZeRO-3 on 2 gloo ranks with ``sequence_parallel=2`` (one
    sequence in flight, each rank half of it, 2 micro-batches per step, the LM head in 2 tiles, the MLPs in 2 tiles)
    follows the single-process engine (untiled) on the same sequences for 6 steps (losses within 1e-4, weights as the
    2-rank ZeRO-3 test bounds them), and a run stopped after a checkpoint (the launcher's stop request, as on Slurm's
    SIGTERM) resumes to bit-identical weights. Caught: the loss computed past the engine's forward lost every first
    micro-batch's gradient (DeepSpeed counts micro-steps in ``engine.forward``)."""
    import threading

    from safetensors.torch import load_file

    from harness.config import to_args
    from harness.data import build_data
    from harness.models import build_model
    from harness.train import Preempted
    from harness.train import deepspeed_engine as de
    from harness.train.loop import finetune

    cfg = OmegaConf.create({
        "model": {"name": "tiny_llama", "path": str(_model_dir(tmp_path)), "native_ctx": C},
        "method": _method("yarn", scale=2.0),
        "data": {"name": "local_mix", "shares": {"synthetic": 1.0}, "synthetic_docs": 40, "doc_tokens": 512,
                 "cache_dir": str(tmp_path / "cache"), "seed": 0},
        "train": {"name": "t", "enabled": True, "engine": "deepspeed", "world_size": 2, "sequence_parallel": 2,
                  "seq_len": 2 * C, "tokens": 2 * C * 2 * 6, "global_batch": 2, "micro_batch": 1, "lr": 5e-3,
                  "warmup_steps": 1, "ema": True, "ema_decay": 0.5, "save_every": 2, "autocast": "float32",
                  "log_every": 1, "seed": 0, "logits_tile_mib": 1, "mlp_tiles": 2},
        "seed": 0})
    a = to_args(TrainArgs, cfg.train, "train")
    a.validate()

    def fresh():
        method = build_method(cfg.method)
        handle = build_model(cfg.model)
        method.apply(handle)
        return handle, method

    chunks = build_data(cfg.data, fresh()[0].tokenizer, a.seq_len, a.tokens)  # the ranks reuse this cache
    h1, m1 = fresh()
    info = de.launch(cfg, h1, m1, a, tmp_path / "ckpt1", "fp", tmp_path / "run1")
    assert info["sequence_parallel"] == 2 and info["effective_global_batch"] == 2 and len(info["losses"]) == 6
    h0, m0 = fresh()
    single = TrainArgs(**{**a.__dict__, "engine": "single", "world_size": 1, "sequence_parallel": 1,
                          "mlp_tiles": 1})
    sinfo = finetune(h0, m0, chunks, single, tmp_path / "ck_single", "fp-single")
    np.testing.assert_allclose(info["losses"], sinfo["losses"], rtol=1e-4, atol=1e-4)
    init, _ = fresh()
    for (n, p), (_, q), (_, p0) in zip(h1.model.named_parameters(), h0.model.named_parameters(),
                                       init.model.named_parameters()):
        moved, diff = (q - p0).abs().mean().item(), (p - q).abs()
        assert diff.max().item() < 2e-3 and diff.mean().item() < 0.01 * moved + 1e-7, (n, diff.max().item(), moved)

    job, ckpt = tmp_path / "run2" / "train_job", tmp_path / "ckpt2"

    def stop_after_first_checkpoint():
        while not list(ckpt.glob("step_*")):
            time.sleep(0.05)
        (job / de.STOP_FILE).write_text("SIGTERM")

    threading.Thread(target=stop_after_first_checkpoint, daemon=True).start()
    h2, m2 = fresh()
    with pytest.raises(Preempted, match="training saved a checkpoint at step"):
        de.launch(cfg, h2, m2, a, ckpt, "fp", tmp_path / "run2")
    h3, m3 = fresh()
    resumed = de.launch(cfg, h3, m3, a, ckpt, "fp", tmp_path / "run2")
    assert resumed["resumed_from_step"] and resumed["losses"] == info["losses"]
    w1, w2 = (load_file(d / "train_job" / "final" / "model.safetensors") for d in (tmp_path / "run1",
                                                                                    tmp_path / "run2"))
    assert w1.keys() == w2.keys() and all(torch.equal(w1[k], w2[k]) for k in w1)


@pytest.mark.unit
def test_the_plan_gives_memory_per_rank_with_the_sequence_split():
    """docs/sequence_parallel.md's table: LLaMA-2-7B at 128k on 8 x 80 GB fits only with the sequence over 8 ranks
    (activations at T/8, the loss in tiles); the state terms do not change."""
    from harness import plan

    s = plan.model_shape(OmegaConf.create({"model": yaml.safe_load((ROOT / "conf/model/llama2_7b.yaml").read_text())}))
    one = plan.memory_per_rank(s, s.params, 8, 1, 131072, True, True, False)
    split = plan.memory_per_rank(s, s.params, 8, 1, 131072, True, True, False, 8, 256)
    assert one["total"] == 125.01 and split["total"] == 25.88, (one, split)
    assert split["activations.checkpoints"] * 8 == one["activations.checkpoints"]
    assert all(one[k] == split[k] for k in ("parameters", "gradients", "optimizer", "ema", "gathered_parameters"))
    assert "activations.logits_and_loss" not in split and split["activations.logits_and_loss_tiled"] == 0.75
    doc = (ROOT / "docs" / "sequence_parallel.md").read_text()
    tiled = plan.memory_per_rank(s, s.params, 8, 1, 131072, True, True, False, 8, 256, 8)
    assert tiled["total"] == 23.53 and tiled["activations.recomputed_layer"] == 2.34  # 4.69 -> 2.34: the MLP's 4f / 8
    for v in ("125.01", "25.88", "70.72", "21.41", "23.53", "61.32", "106.19"):
        assert v in doc


@pytest.mark.unit
def test_mlps_in_tiles_give_the_untiled_loss_and_gradients_with_a_fraction_of_the_tokens_at_once():
    """``train.mlp_tiles=4`` (DeepSpeed's TiledMLP on every gated MLP): fp32, 2 x 128 tokens, the loss within 1e-6
    (relative) and every gradient within 1e-5 of the largest of the untiled model's; each MLP projection sees at most
    a quarter of the tokens at once, in the forward and in the backward's recompute."""
    import copy

    from harness.train.zero.sequence import tile_mlps

    torch.manual_seed(0)
    ref = random_llama(vocab=128, hidden=32, layers=2, heads=2, ctx=C, seed=3)
    tiled = copy.deepcopy(ref)
    assert tile_mlps(tiled, 4) == 2 and tile_mlps(ref, 1) == 0
    rows = []
    for layer in tiled.model.layers:
        layer.mlp.gate_proj.register_forward_hook(lambda m, inp, out: rows.append(inp[0].reshape(-1, 32).shape[0]))
    ids = torch.randint(0, 128, (2, 128))
    losses, grads = [], []
    for m in (ref, tiled):
        m.zero_grad()
        loss = m(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss.item())
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None})
    assert abs(losses[0] - losses[1]) <= 1e-6 * abs(losses[0])
    assert grads[0].keys() == grads[1].keys()
    top = max(g.abs().max().item() for g in grads[0].values())
    assert max((grads[0][k] - grads[1][k]).abs().max().item() for k in grads[0]) <= 1e-5 * top
    assert rows and max(rows) <= 2 * 128 // 4 and len(rows) == 2 * 4 * 2  # 2 layers x 4 tiles x forward, recompute
    with pytest.raises(ConfigError, match="train.mlp_tiles=2 needs train.engine=deepspeed"):
        TrainArgs(name="t", enabled=True, seq_len=8, tokens=64, global_batch=1, mlp_tiles=2).validate()
