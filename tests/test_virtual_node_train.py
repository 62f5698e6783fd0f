"""The DeepSpeed launcher and a training rank on the virtual node (``tests/virtual_node.py``): the rank's step runs on
an emulated GPU with a process group that, like NCCL, has no backend for CPU tensors; the parent's copy of the model
is off every GPU while the ranks train, and the gathered weights are loaded into it and put back where it was."""
from __future__ import annotations

import gc
import json
import signal

import pytest
import torch
import torch.distributed as dist
from safetensors.torch import save_file

from harness.train import deepspeed_engine as de
from harness.train.zero import launch as zero_launch
from harness.train.zero import rank as zero_rank
from tests.conftest import random_llama
from tests.virtual_node import allocated, gpu, on_gpus, to_accelerator


@pytest.fixture
def nccl_like_node(virtual_node, monkeypatch):
    """The virtual node with a 2-rank process group (this process is rank 0) whose only backend is for the emulated
    GPUs: a collective on a CPU tensor is refused ("No backend type associated with device type cpu"), as NCCL
    refuses it."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group(backend="meta:fake", store=FakeStore(), rank=0, world_size=2)
    before = {s: signal.getsignal(s) for s in de.STOP_SIGNALS}
    try:
        yield virtual_node
    finally:
        for s, h in before.items():
            signal.signal(s, h)
        if dist.is_initialized():
            dist.destroy_process_group()


class PlainEngine:
    """Stands in for DeepSpeed's engine (not what is tested): data parallelism without partitioning, the module on
    the rank's GPU as ``deepspeed.initialize`` puts it, the client optimizer and scheduler stepped at the boundary."""

    def __init__(self, model, optimizer, lr_scheduler, config):
        self.module = to_accelerator(model, gpu(torch.cuda.current_device()))
        self.optimizer = optimizer
        for group in optimizer.param_groups:  # the partitions' fp32 copies live on the GPU
            group["params"] = [p for p in self.module.parameters() if p.requires_grad]
            group.update(fused=False, foreach=False)  # torch's fused AdamW is a CUDA kernel: the same rule, unfused
        self.scheduler = lr_scheduler(optimizer)
        self.acc = int(config["gradient_accumulation_steps"])
        self.micro = 0
        self.checkpoint_engine = type("CheckpointEngine", (), {})()

    def __call__(self, **batch):
        return self.module(**batch)

    def parameters(self):
        return self.module.parameters()

    def backward(self, loss, scale_wrt_gas=False):
        loss.backward()

    def step(self):
        self.micro += 1
        if self.micro % self.acc == 0:
            self.optimizer.step()
            self.optimizer.zero_grad()
            self.scheduler.step()


def _spec(tmp_path, model_dir) -> object:
    from harness.config import to_args
    from harness.data import build_data
    from harness.models import build_model
    from harness.train import TrainArgs

    plain = {
        "model": {"name": "tiny_llama", "path": str(model_dir), "native_ctx": 64},
        "method": {"name": "base"},
        "data": {"name": "local_mix", "shares": {"synthetic": 1.0}, "synthetic_docs": 8, "doc_tokens": 128,
                 "cache_dir": str(tmp_path / "cache"), "seed": 0},
        "train": {"name": "t", "enabled": True, "engine": "deepspeed", "world_size": 2, "seq_len": 32,
                  "tokens": 32 * 2 * 1, "global_batch": 2, "micro_batch": 1, "lr": 1e-3, "warmup_steps": 1,
                  "ema": False, "save_every": 0, "autocast": "float32", "log_every": 1, "seed": 0},
        "seed": 0}
    from omegaconf import OmegaConf

    cfg = OmegaConf.create(plain)
    a = to_args(TrainArgs, cfg.train, "train")
    build_data(cfg.data, build_model(cfg.model).tokenizer, a.seq_len, a.tokens)  # the parent builds the cache
    return de.write_spec(plain, tmp_path / "ckpt", "fp", tmp_path / "job")


def test_a_training_rank_steps_on_its_gpu_under_an_nccl_like_group(nccl_like_node, tmp_path, monkeypatch):
    """One optimizer step of ``train_rank`` on emulated GPU 0: batches moved to the rank's GPU, the step's
    all-reduce (loss + stop flag) on a tensor of that GPU -- with the CPU tensor the old code all-reduced (at its
    call site, ``reduce_step(..., torch.device("cpu"))``) the group refuses the step -- and the gathered weights
    written by rank 0."""
    import deepspeed

    from tests.test_train import _model_dir

    spec = _spec(tmp_path, _model_dir(tmp_path))
    monkeypatch.setattr(deepspeed, "init_distributed", lambda **kw: None)  # the group above is the rank's
    monkeypatch.setattr(deepspeed, "initialize", lambda model, model_parameters, optimizer, lr_scheduler, config:
                        (PlainEngine(model, optimizer, lr_scheduler, config), optimizer, None, None))
    monkeypatch.setattr(zero_rank, "watch_launcher", lambda: None)  # no parent process to watch here
    reduced = []
    real = zero_rank.reduce_step
    monkeypatch.setattr(zero_rank, "reduce_step", lambda *a: reduced.append(a[-1]) or real(*a))
    with nccl_like_node:
        info = de.train_rank(spec)
    assert reduced == [gpu(0)]  # the collective's tensor lived on the rank's GPU
    assert info["steps"] == 1 and info["world_size"] == 2
    assert (tmp_path / "job" / "final" / "model.safetensors").is_file()


def test_the_parent_holds_no_weight_on_a_gpu_while_the_ranks_train(virtual_node, tmp_path, monkeypatch):
    """``launch`` moves the parent's copy off the GPUs (and empties the cache) before torchrun starts the ranks;
    the gathered weights are loaded into it after, and it goes back to its GPU. Before, the copy stayed on GPU 0
    (and 1) beside rank 0: by the plan's numbers the 64k points then exceed an 80 GB card at step 1."""
    from omegaconf import OmegaConf

    from harness.methods import build_method
    from harness.models import ModelHandle, place
    from harness.train import TrainArgs

    model = random_llama(layers=2)
    handle = ModelHandle(model, None, "random", 64, {})
    method = build_method({"name": "base"})
    trained = {n: p.detach() + 1.0 for n, p in model.named_parameters()}
    seen = {}

    def ranks(job, world_size, log=None, node=None):  # stands in for torchrun + the ranks: what the parent holds now
        seen.update(gpus=on_gpus(handle.model), bytes=[allocated(i) for i in range(virtual_node.gpus)],
                    emptied=virtual_node.empty_cache_calls)
        final = job / "final"
        final.mkdir()
        save_file({n: t.clone().contiguous() for n, t in trained.items()}, final / "model.safetensors")
        (final / "info.json").write_text(json.dumps({"steps": 1}))
        return 0

    monkeypatch.setattr(zero_launch, "train_job", ranks)
    a = TrainArgs(name="t", enabled=True, engine="deepspeed", world_size=2, seq_len=32, tokens=64, global_batch=2,
                  micro_batch=1, lr=1e-3, warmup_steps=1, ema=False, autocast="float32", save_every=0)
    cfg = OmegaConf.create({"model": {"name": "random"}, "train": {"name": "t"}})
    with virtual_node:
        gc.collect()
        before = [allocated(i) for i in range(virtual_node.gpus)]  # other tests' tensors may still be alive
        place(handle.model, gpu(0))
        assert on_gpus(handle.model) == {0} and allocated(0) > before[0]
        info = de.launch(cfg, handle, method, a, tmp_path / "ckpt", "fp", tmp_path / "run")
        held = seen.pop("bytes")
        assert seen == {"gpus": set(), "emptied": 1} and all(h <= b for h, b in zip(held, before))
        assert info == {"steps": 1} and on_gpus(handle.model) == {0}
        for n, p in handle.model.named_parameters():
            torch.testing.assert_close(p.detach().to("cpu"), trained[n])


@pytest.mark.integration  # DeepSpeed's communication front starts a compiler probe (gcc)
def test_ulysses_exchange_reaches_the_group_with_device_tensors(nccl_like_node, monkeypatch):
    """DeepSpeed's sequence-parallel all-to-all is the custom op ``deepspeed::dim_zero_all_to_all``, not a ``c10d``
    op: forward and backward on an emulated GPU reach the NCCL-like group with tensors on that GPU (run on the CPU
    data behind it, the group refused them: "No backend type associated with device type cpu")."""
    import deepspeed.comm.comm as ds_comm
    from deepspeed.sequence.layer import _dim_zero_all_to_all, register_all_to_all_group

    monkeypatch.setattr(ds_comm, "cdb", None)  # DeepSpeed's communication front over this group, for this test only
    ds_comm.init_distributed(dist_backend="gloo", auto_mpi_discovery=False, verbose=False)
    group = dist.group.WORLD
    register_all_to_all_group(group)
    with nccl_like_node:
        x = torch.randn(2, 4, 1, 2, 8, device=gpu(0), requires_grad=True)  # [ws, sl_l, bs, hc_l, hs]
        y = _dim_zero_all_to_all(group, x)
        assert y.device == gpu(0) and y.shape == x.shape
        y.float().sum().backward()
        assert x.grad is not None and x.grad.device == gpu(0)


@pytest.mark.unit
def test_the_sequence_group_s_length_and_draws_reach_the_group_with_device_tensors(nccl_like_node):
    """The RoPE's global length (``all_reduce(MAX)``) and CLEX's shared draw (``broadcast``) under sequence
    parallelism carry tensors on the positions' GPU, which an NCCL-like group accepts (a CPU tensor: refused)."""
    from harness import sequence_group as sg

    sg.set_sequence_group(dist.group.WORLD)
    try:
        with nccl_like_node:
            pos = torch.arange(64, device=gpu(0))[None]
            assert sg.global_length(pos) == 64  # the fake group's all-reduce leaves this rank's maximum
            draw = sg.agreed(torch.rand(3, device=gpu(0)))
            assert draw.device == gpu(0)
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            sg.global_length(torch.arange(64)[None])
    finally:
        sg.set_sequence_group(None)
