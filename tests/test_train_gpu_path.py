"""The distributed engine's GPU and cluster paths, exercised on this CPU: collectives on a process group that refuses
CPU tensors as NCCL does (``cuda:fake``) with tensors on a fake CUDA device (FakeTensorMode), the optimizer chosen
on a GPU, the stop-and-save logic on SIGUSR2 / SIGTERM (Slurm, submitit), and Slurm's --cpus-per-task."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist
from conftest import ROOT

from harness.train import Preempted, Terminated, TrainArgs
from harness.train import deepspeed_engine as de
from harness.train.ema import EMA

CUDA = torch.device("cuda", 0)


@pytest.fixture
def nccl_like():
    """A 2-rank process group that, like NCCL, has no backend for CPU tensors, and a fake-tensor mode in which
    tensors made on ``cuda`` are fake CUDA tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group(backend="cuda:fake", store=FakeStore(), rank=0, world_size=2)
    try:
        yield FakeTensorMode(allow_non_fake_inputs=True)
    finally:
        dist.destroy_process_group()


def _fake_cuda(mode, shape) -> torch.Tensor:
    from torch._subclasses.fake_tensor import FakeTensor

    return FakeTensor(mode, torch.empty(shape, device="meta"), CUDA)


def _zero3_param(mode, shape, world=2) -> torch.nn.Parameter:
    """A parameter as ZeRO-3 leaves it: ``ds_tensor`` is this rank's contiguous slice (padded) of the flat tensor."""
    p = torch.nn.Parameter(_fake_cuda(mode, (0,)))
    p.ds_numel, p.ds_shape = math.prod(shape), torch.Size(shape)
    p.ds_tensor = _fake_cuda(mode, (math.ceil(p.ds_numel / world),))
    return p


# ------------------------------------------------------------------------------------------ collectives on dev
def test_step_reduction_runs_on_the_gpu_under_an_nccl_like_group(nccl_like):
    """The training step's all-reduce (loss + stop flag) carries a tensor on the rank's device: with the
    collective's device a (fake) GPU it runs; a CPU tensor (the old ``torch.tensor([loss])``) is refused."""
    with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
        de.reduce_step(1.25, False, torch.device("cpu"))  # the group refuses CPU tensors, as NCCL does
    with nccl_like:
        out = de.reduce_step(1.25, True, CUDA)  # the reduced tensor itself: on the collective's device
        assert out.device == CUDA and out.shape == (2,) and out.dtype == torch.float64


def test_gather_of_zero3_partitions_on_the_gpu(nccl_like):
    """The final gather of the (EMA) partitions all-gathers GPU tensors and rebuilds the parameter's shape."""
    with nccl_like:
        p = _zero3_param(nccl_like, (5, 3))
        full = de.gather_full(p, p.ds_tensor, CUDA)
        assert full.shape == (5, 3) and full.device == CUDA
        ema = EMA([("w", p)], 0.9, local=de.partition)
        assert ema.shadow["w"].device == CUDA and ema.shadow["w"].dtype == torch.float32
        full = de.gather_full(p, ema.shadow["w"], CUDA)
        assert full.shape == (5, 3) and full.device == CUDA


def test_ema_read_back_from_a_checkpoint_lives_with_its_partition(nccl_like):
    """A resumed run's EMA partitions come from a CPU file; they must land on the partition's (GPU) device, or the
    first EMA update after resuming mixes devices."""
    with nccl_like:
        p = _zero3_param(nccl_like, (4, 4))
        ema = EMA([("w", p)], 0.9, local=de.partition)
        state = {"decay": 0.9, "bias_correction": False, "steps": 3, "shadow": {"w": torch.zeros(8)}}
        ema.load_state_dict(state)  # as checkpoint.load_state gives it: on the CPU
        assert ema.shadow["w"].device == CUDA and ema.shadow["w"].shape == (8,)


# ------------------------------------------------------------------------------------------ optimizer on GPU
def _paper_args(**kw) -> TrainArgs:
    from omegaconf import OmegaConf

    from harness.config import to_args

    node = OmegaConf.load(ROOT / "conf" / "train" / "paper.yaml")
    node.seed = 0
    a = to_args(TrainArgs, node, "train=paper")
    a = TrainArgs(**{**a.__dict__, **kw})
    a.validate()
    return a


def test_gpu_uses_torch_fused_adamw_and_no_jit_op(nccl_like):
    """train=paper on a GPU: torch's fused AdamW as the client optimizer and no DeepSpeed "optimizer" block (which
    would JIT-compile FusedAdam with nvcc in every rank); DeepSpeed's AdamW only with offload or when asked."""
    a = _paper_args()
    conf = de.ds_config(a, on_gpu=True)
    assert "optimizer" not in conf and conf["zero_allow_untested_optimizer"]
    assert de.optimizer_kind(a, True) == "torch_fused"
    assert de.OPTIMIZERS["torch_fused"] == "torch AdamW fused (client optimizer)"  # the row's train_info
    with nccl_like:
        opt = de.client_optimizer(a, [torch.nn.Parameter(_fake_cuda(nccl_like, (4, 4)))], on_gpu=True)
    assert type(opt) is torch.optim.AdamW and opt.defaults["fused"] is True
    assert opt.defaults["lr"] == 2e-5 and opt.defaults["weight_decay"] == 0.0 and opt.defaults["betas"] == (0.9, 0.95)
    assert de.prebuild_optimizer_op(a, True) is None  # nothing to compile before the ranks start
    # offload: DeepSpeed's CPU Adam (built once by launch before torchrun); asked-for DeepSpeed AdamW: FusedAdam
    off = _paper_args(offload=True)
    assert de.optimizer_kind(off, True) == "deepspeed" and de.ds_config(off, True)["optimizer"]["type"] == "AdamW"
    assert de.client_optimizer(off, [], True) is None
    asked = _paper_args(optimizer="deepspeed")
    assert de.optimizer_kind(asked, True) == "deepspeed" and "optimizer" in de.ds_config(asked, True)
    forced = de.ds_config(_paper_args(offload=True, optimizer="torch"), True)
    assert "optimizer" not in forced and forced["zero_force_ds_cpu_optimizer"] is False
    # CPU without offload: plain torch AdamW (not fused; the 2-rank test compares it with the single engine)
    assert de.optimizer_kind(a, False) == "torch"
    cpu_opt = de.client_optimizer(a, [torch.nn.Parameter(torch.zeros(2))], on_gpu=False)
    assert not cpu_opt.defaults.get("fused")


# ------------------------------------------------------------------------------------------ stop on a signal
def test_stop_flag_from_a_signal_or_the_launchers_file(tmp_path):
    flag = de.StopFlag(tmp_path, install=False)
    assert not flag.requested()
    (tmp_path / de.STOP_FILE).write_text("SIGUSR2")  # what SignalRelay writes in the launching process
    assert flag.requested() and flag.name() == "SIGUSR2"
    before = {s: signal.getsignal(s) for s in de.STOP_SIGNALS}
    try:
        own = de.StopFlag(tmp_path / "none", install=True)
        os.kill(os.getpid(), signal.SIGTERM)  # Slurm's preemption signal, delivered to the rank itself
        time.sleep(0.05)
        assert own.requested() and own.name() == "SIGTERM"
    finally:
        for s, h in before.items():
            signal.signal(s, h)


AGREE = textwrap.dedent("""
    import os, sys, torch, torch.distributed as dist
    from harness.train.deepspeed_engine import reduce_step
    rank = int(sys.argv[1])
    dist.init_process_group("gloo", init_method="file://" + sys.argv[2], rank=rank, world_size=2)
    loss_sum, stopping = reduce_step(1.0 + rank, rank == 1, torch.device("cpu")).tolist()
    print(loss_sum, stopping)
    dist.destroy_process_group()
""")


def test_ranks_agree_on_stopping_when_one_rank_got_the_signal(tmp_path):
    """Two gloo ranks: only rank 1 was signalled; after the step's all-reduce both see one stop request (so both
    save and leave together) and the summed loss."""
    procs = [subprocess.Popen([sys.executable, "-c", AGREE, str(r), str(tmp_path / "rdzv")], cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT))) for r in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-1500:] for o in outs]
    assert [o[0].split() for o in outs] == [["3.0", "1.0"]] * 2


def test_signal_relay_passes_the_request_on_and_replays_it(tmp_path):
    """In the launching process: SIGTERM / SIGUSR2 while torchrun runs do not end the process (which would kill
    the ranks unsaved) but write the stop file; afterwards the previous handlers are back, a preempted run raises
    ``Preempted`` naming the step, and a SIGUSR2 goes on to the handler that was there (submitit's requeue)."""
    calls = []
    before = {s: signal.getsignal(s) for s in de.STOP_SIGNALS}
    try:
        signal.signal(signal.SIGUSR2, lambda s, f: calls.append(s))  # stands in for submitit's handler
        with de.SignalRelay(tmp_path) as relay:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
        assert relay.caught == [signal.SIGTERM] and (tmp_path / de.STOP_FILE).read_text() == "SIGTERM"
        assert signal.getsignal(signal.SIGTERM) is before[signal.SIGTERM]
        with pytest.raises(Preempted, match="saved a checkpoint at step 7"):
            relay.replay("preempted by SIGTERM: training saved a checkpoint at step 7 of 9")
        relay.caught = [signal.SIGTERM]
        with pytest.raises(Terminated, match="terminated by SIGTERM"):  # training had finished
            relay.replay(None)

        (tmp_path / de.STOP_FILE).unlink()
        with de.SignalRelay(tmp_path) as relay:
            os.kill(os.getpid(), signal.SIGUSR2)
            time.sleep(0.05)
        assert calls == [] and (tmp_path / de.STOP_FILE).read_text() == "SIGUSR2"
        with pytest.raises(Preempted):
            relay.replay("preempted by SIGUSR2: training saved a checkpoint at step 3 of 9")
        assert calls == [signal.SIGUSR2]
    finally:
        for s, h in before.items():
            signal.signal(s, h)


PARENT = textwrap.dedent("""
    import sys
    from pathlib import Path
    from harness.train import Preempted
    from harness.train import deepspeed_engine as de
    spec = de.write_spec({cfg!r}, Path({ckpt!r}), "fp", Path({job!r}))
    try:
        rc = de.train_job(spec.parent, 2)
    except Preempted as e:
        print("PREEMPTED", e, flush=True)
        sys.exit(3)
    sys.exit(rc)
""")


@pytest.mark.slow  # 42 s (the default tier's 20 minutes); ZeRO-3's two ranks stay there (test_train.py)
def test_zero3_ranks_save_and_stop_on_slurms_sigterm_then_resume(tmp_path):
    """SIGTERM to every process of the job (as Slurm signals a job step: launcher, torchrun, both ranks) mid-run:
    torchrun survives, the ranks finish the step, save a checkpoint of it and exit; the launcher raises Preempted
    naming that step; the same job started again resumes from it and finishes."""
    import psutil
    from omegaconf import OmegaConf
    from test_train import _model_dir

    from harness.config import to_args
    from harness.data import build_data
    from harness.models import build_model

    plain = {
        "model": {"name": "tiny_llama", "path": str(_model_dir(tmp_path)), "native_ctx": 64},
        "method": {"name": "base"},
        "data": {"name": "local_mix", "shares": {"synthetic": 1.0}, "synthetic_docs": 40, "doc_tokens": 256,
                 "cache_dir": str(tmp_path / "cache"), "seed": 0},
        "train": {"name": "t", "enabled": True, "engine": "deepspeed", "world_size": 2, "seq_len": 64,
                  "tokens": 64 * 2 * 200, "global_batch": 2, "micro_batch": 1, "lr": 5e-3, "warmup_steps": 1,
                  "ema": True, "ema_decay": 0.5, "save_every": 100, "autocast": "float32", "log_every": 1,
                  "seed": 0},
        "seed": 0}
    cfg = OmegaConf.create(plain)
    a = to_args(TrainArgs, cfg.train, "train")
    build_data(cfg.data, build_model(cfg.model).tokenizer, a.seq_len, a.tokens)  # the ranks reuse this cache
    ckpt, job = tmp_path / "ckpt", tmp_path / "job"
    code = PARENT.format(cfg=plain, ckpt=str(ckpt), job=str(job))
    log = open(tmp_path / "parent.log", "w")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=log, text=True, cwd=ROOT,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)), start_new_session=True)
    deadline = time.time() + 600  # a bound on a hang, not a speed check
    while "step 3/200" not in (tmp_path / "parent.log").read_text():
        assert parent.poll() is None and time.time() < deadline, (tmp_path / "parent.log").read_text()[-3000:]
        time.sleep(0.2)
    family = [psutil.Process(parent.pid), *psutil.Process(parent.pid).children(recursive=True)]
    assert len(family) >= 4, family  # launcher + torchrun + 2 ranks
    for p in family:
        p.send_signal(signal.SIGTERM)
    try:
        out, _ = parent.communicate(timeout=300)
    finally:
        for p in family:  # never leave a stray rank behind, even when the test fails
            try:
                p.kill()
            except psutil.Error:
                pass
    err = (tmp_path / "parent.log").read_text()
    assert parent.returncode == 3, (out, err[-3000:])
    marker = json.loads((job / de.PREEMPTED_FILE).read_text())
    assert marker["signal"] == "SIGTERM" and 3 <= marker["step"] < 200
    assert f"training saved a checkpoint at step {marker['step']} of 200" in out
    assert (ckpt / f"step_{marker['step']}" / "meta.json").exists()

    rc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)),
                        capture_output=True, text=True, timeout=900)
    assert rc.returncode == 0, rc.stderr[-3000:]
    info = json.loads((job / "final" / "info.json").read_text())
    assert info["resumed_from_step"] == marker["step"] and len(info["losses"]) == 200
    assert info["optimizer"] == "torch AdamW (client optimizer)"
