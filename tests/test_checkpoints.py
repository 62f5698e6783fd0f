"""Resumable checkpoints: no pickles, a corrupt newest checkpoint falls back to the previous one (with a warning
naming the file) and still ends with the uninterrupted run's weights, concurrent runs of one config do not corrupt
each other, finished runs clean up, and the resume key follows what changes results."""
from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import ROOT, random_llama

from harness.methods import Method, MethodArgs
from harness.models import ModelHandle
from harness.train import TrainArgs
from harness.train.checkpoint import Store, load_state, save_state
from harness.train.ema import EMA
from harness.train.loop import finetune, rng_state

KW = dict(name="t", enabled=True, seq_len=32, tokens=32 * 4 * 6, global_batch=4, micro_batch=1, lr=3e-3,
          warmup_steps=2, ema=True, ema_decay=0.5, save_every=2, seed=0, grad_clip=1.0)


def _chunks(n=32, L=32, vocab=256, seed=0):
    rng = np.random.default_rng(seed)
    return np.repeat(rng.integers(3, vocab, size=(n, L // 4)), 4, axis=1).astype(np.uint16)


def _run(ckpt: Path, **kw):
    model = random_llama(vocab=256, seed=1)
    info = finetune(ModelHandle(model, None, "rand", 64), Method(MethodArgs(name="base")), _chunks(),
                    TrainArgs(**{**KW, **kw}), ckpt, "fp")
    return model, info


def _same_weights(a, b) -> bool:
    return all(torch.equal(p, q) for (_, p), (_, q) in zip(a.named_parameters(), b.named_parameters()))


def test_training_state_round_trips_without_pickle(tmp_path):
    """Optimizer, scheduler, EMA and every RNG state survive tensors + JSON exactly; the files hold no pickle."""
    model = random_llama(vocab=64, hidden=32, layers=1, heads=2, ctx=32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5)
    model(input_ids=torch.ones(1, 8, dtype=torch.long), labels=torch.ones(1, 8, dtype=torch.long)).loss.backward()
    opt.step()
    sched.step()
    ema = EMA(model, 0.9)
    random.random(), np.random.rand(), torch.rand(1)
    state = {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "ema": ema.state_dict(),
             "rng": rng_state()}
    save_state(tmp_path, "s", state)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.json", "s.safetensors"]
    back = load_state(tmp_path, "s")
    assert back["scheduler"] == sched.state_dict()
    assert back["optimizer"]["param_groups"] == opt.state_dict()["param_groups"]
    for k, v in opt.state_dict()["state"].items():
        assert all(torch.equal(v[n], back["optimizer"]["state"][k][n]) for n in v)
    assert all(torch.equal(ema.shadow[n], back["ema"]["shadow"][n]) for n in ema.shadow)
    assert back["rng"]["python"] == state["rng"]["python"] and torch.equal(back["rng"]["torch"], state["rng"]["torch"])
    np_a, np_b = state["rng"]["numpy"], back["rng"]["numpy"]
    assert np_a[0] == np_b[0] and np.array_equal(np_a[1], np_b[1]) and np_b[1].dtype == np.uint32
    assert tuple(np_a[2:]) == tuple(np_b[2:])


def test_no_pickle_load_of_training_state():
    """No ``torch.load`` of the harness unpickles arbitrary objects."""
    offenders = [str(p.relative_to(ROOT)) for p in (ROOT / "harness").rglob("*.py")
                 if re.search(r"weights_only\s*=\s*False", p.read_text())]
    assert not offenders, offenders


def _flip_tensor_bytes(path: Path, n: int = 64) -> None:
    """Invert ``n`` bytes in the middle of a safetensors file's tensor data: its size and JSON header stay intact,
    so it still loads (into different weights)."""
    raw = bytearray(path.read_bytes())
    start = 8 + int.from_bytes(raw[:8], "little")  # u64 header length, then the header, then the tensor bytes
    mid = start + (len(raw) - start) // 2
    raw[mid:mid + n] = bytes(b ^ 0xFF for b in raw[mid:mid + n])
    size = path.stat().st_size
    path.write_bytes(bytes(raw))
    assert path.stat().st_size == size


@pytest.mark.parametrize("damage", ["truncate model", "garbage state json", "delete state tensors",
                                    "flip tensor bytes", "flip optimizer bytes", "flip bytes, digests removed"])
def test_corrupt_newest_checkpoint_falls_back_with_warning(tmp_path, capsys, damage):
    ckpt = tmp_path / "ck"
    _run(ckpt, keep_checkpoints=True)  # leaves step_2 and step_4 (the previous one is the fallback)
    assert sorted(d.name for d in ckpt.glob("step_*")) == ["step_2", "step_4"]
    newest = ckpt / "step_4"
    if damage == "truncate model":
        bad = newest / "model.safetensors"
        bad.write_bytes(bad.read_bytes()[:1000])
    elif damage == "garbage state json":
        bad = newest / "train_state.json"
        bad.write_text("{not json")
    elif damage == "flip tensor bytes":  # same size, same header: only the content digest tells
        bad = newest / "model.safetensors"
        _flip_tensor_bytes(bad)
        from safetensors.torch import load_file
        assert load_file(str(bad))  # still loads without complaint
    elif damage == "flip optimizer bytes":
        bad = newest / "train_state.safetensors"
        _flip_tensor_bytes(bad)
    elif damage == "flip bytes, digests removed":  # issue 46: resumed from the flipped bytes, no warning
        _flip_tensor_bytes(newest / "model.safetensors")
        bad = newest / "meta.json"
        meta = json.loads(bad.read_text())
        del meta["sha256"]
        bad.write_text(json.dumps(meta))
    else:
        bad = newest / "train_state.safetensors"
        bad.unlink()
    capsys.readouterr()
    resumed, info = _run(ckpt)
    err = capsys.readouterr().err
    assert f"warning: checkpoint file {bad} is unusable" in err and f"falling back to {ckpt / 'step_2'}" in err, err
    assert info["resumed_from_step"] == 2
    reference, ref_info = _run(tmp_path / "fresh")
    assert _same_weights(resumed, reference) and info["losses"] == ref_info["losses"]
    assert not list(ckpt.glob("step_*"))  # finished: cleaned up


def test_finished_run_cleans_up_unless_asked_to_keep(tmp_path):
    _run(tmp_path / "a")
    assert not list((tmp_path / "a").glob("step_*")) and not list((tmp_path / "a").glob(".tmp-*"))
    _run(tmp_path / "b", keep_checkpoints=True)
    assert sorted(d.name for d in (tmp_path / "b").glob("step_*")) == ["step_2", "step_4"]
    meta = json.loads((tmp_path / "b" / "step_4" / "meta.json").read_text())
    assert meta["key"] == "fp" and meta["step"] == 4 and meta["files"]["model.safetensors"] > 0


def test_checkpoint_files_get_the_umask_permissions(tmp_path):
    """Checkpoint files are readable by teammates as rows are (the umask's mode), not safetensors' 0600; meta.json
    records a SHA-256 per file."""
    from harness.results import FILE_MODE

    _run(tmp_path / "ck", keep_checkpoints=True)
    d = tmp_path / "ck" / "step_4"
    modes = {f.name: f.stat().st_mode & 0o777 for f in d.iterdir()}
    assert modes and set(modes.values()) == {FILE_MODE}, modes
    meta = json.loads((d / "meta.json").read_text())
    assert set(meta["sha256"]) == set(meta["files"]) and all(len(h) == 64 for h in meta["sha256"].values())


def test_publish_prunes_dead_writers_and_keeps_live_ones(tmp_path):
    store = Store(tmp_path, "k")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / ".tmp-step_3-dead"
    orphan.mkdir()
    (orphan / "writer.json").write_text(json.dumps({"host": os.uname().nodename, "pid": dead.pid}))
    mine = store.new_tmp(5)
    tmp = store.new_tmp(1)
    (tmp / "x.bin").write_bytes(b"123")
    store.publish(tmp, 1, {})
    assert not orphan.exists() and mine.exists() and (tmp_path / "step_1" / "x.bin").exists()


CONCURRENT = textwrap.dedent("""
    import hashlib, torch, numpy as np
    torch.set_num_threads(1)
    from pathlib import Path
    from tests.conftest import random_llama
    from harness.methods import Method, MethodArgs
    from harness.models import ModelHandle
    from harness.train import TrainArgs
    from harness.train.loop import finetune
    a = TrainArgs(**{args!r}); a.validate()
    model = random_llama(vocab=256, seed=1)
    info = finetune(ModelHandle(model, None, "rand", 64), Method(MethodArgs(name="base")), np.load({chunks!r}), a,
                    Path({ckpt!r}), "fp")
    h = hashlib.sha256()
    for n, p in model.named_parameters():
        h.update(p.detach().numpy().tobytes())
    print("RESULT", h.hexdigest(), info["resumed_from_step"])
""")


@pytest.mark.slow  # ~19 s idle: two concurrent runs of one config; the default tier keeps the damaged-checkpoint checks
def test_concurrent_runs_of_one_config_do_not_corrupt_each_other(tmp_path):
    """Three processes fine-tune the same config into the same checkpoint directory at once (a checkpoint every
    step): all three finish with the weights of a run alone."""
    np.save(tmp_path / "chunks.npy", _chunks())
    args = {**KW, "save_every": 1, "tokens": 32 * 4 * 8}
    code = CONCURRENT.format(args=args, chunks=str(tmp_path / "chunks.npy"), ckpt=str(tmp_path / "shared"))
    procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=ROOT) for _ in range(3)]
    outs = [p.communicate(timeout=900) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outs]
    digests = {[ln for ln in o[0].splitlines() if ln.startswith("RESULT")][0].split()[1] for o in outs}
    alone = subprocess.run([sys.executable, "-c", code.replace(str(tmp_path / "shared"), str(tmp_path / "alone"))],
                           capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert alone.returncode == 0, alone.stderr[-1500:]
    assert digests == {[ln for ln in alone.stdout.splitlines() if ln.startswith("RESULT")][0].split()[1]}


def test_resume_key_follows_what_changes_results(monkeypatch):
    from harness import codeversion, pipeline
    from harness.conf_utils import compose

    cfg = compose(["train=tiny"])
    key = pipeline.resume_key(cfg)
    for override in ("train.save_every=3", "++train.log_every=1", "train.keep_checkpoints=true", "data.cache_dir=/x"):
        assert pipeline.resume_key(compose(["train=tiny", override])) == key, override
    for override in ("train.lr=1e-3", "method=pi", "data.seed=1", "model.native_ctx=128"):
        assert pipeline.resume_key(compose(["train=tiny", override])) != key, override
    monkeypatch.setattr(codeversion, "train_code_version", lambda: {"code": "after-a-fix"})
    assert pipeline.resume_key(cfg) != key  # a re-run after a code change never resumes old weights


def test_the_resume_key_digests_the_code_that_makes_weights_and_not_the_rest():
    """Editing an evaluator, the command-line checks, the factor search or the tables never costs a running study its
    checkpoints (a session's edits to those restarted a 1024-step fine-tune from step 0); editing the training step,
    a method, a model, the data or the gate's pre-training measurement does."""
    from harness import codeversion

    files = {f.relative_to(codeversion.ROOT).as_posix() for f in codeversion.train_code_files()}
    for kept in ("harness/train/loop.py", "harness/train/step.py", "harness/methods/yarn.py",
                 "harness/models/tiny_llama.py", "harness/data/synthetic.py", "harness/pipeline.py",
                 "harness/evals/convergence.py", "scripts/train_distributed.py"):
        assert kept in files, kept
    for left in ("harness/evals/passkey.py", "harness/evals/__init__.py", "harness/precheck.py", "harness/plan.py",
                 "harness/search/__init__.py", "controlled_study/findings/report.py", "harness/stats.py",
                 "harness/cli.py", "harness/lifecycle.py", "harness/results/live.py"):
        assert (codeversion.ROOT / left).is_file() and left not in files, left
