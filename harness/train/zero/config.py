"""The DeepSpeed engine's configuration: its JSON (``ds_config``, the one source of DeepSpeed settings), which AdamW
the ranks run (``optimizer_kind``) and the build of DeepSpeed's compiled optimizer op before the ranks start
(``harness.train.deepspeed_engine`` has the whole story)."""
from __future__ import annotations

import os
from pathlib import Path

from harness.device import accelerator, resolve_dtype
from harness.train import TrainArgs
from harness.train.step import adamw_settings, optimizer

ROOT = Path(__file__).resolve().parents[3]

OPTIMIZERS = {"deepspeed": "deepspeed AdamW", "torch_fused": "torch AdamW fused (client optimizer)",
              "torch": "torch AdamW (client optimizer)"}


def optimizer_kind(a: TrainArgs, on_gpu: bool) -> str:
    """``deepspeed`` (the JSON's AdamW: FusedAdam on GPU, DeepSpeedCPUAdam with offload; JIT-compiled ops),
    ``torch_fused`` (``torch.optim.AdamW(fused=True)`` on the GPU partitions) or ``torch`` (``torch.optim.AdamW``)."""
    if a.optimizer == "deepspeed" or (a.optimizer == "auto" and a.offload):
        return "deepspeed"
    return "torch_fused" if on_gpu and not a.offload else "torch"


def use_ds_optimizer(a: TrainArgs, on_gpu: bool) -> bool:
    return optimizer_kind(a, on_gpu) == "deepspeed"


def client_optimizer(a: TrainArgs, params: list, on_gpu: bool):
    """The torch AdamW handed to ``deepspeed.initialize`` (None when the JSON names DeepSpeed's own)."""
    kind = optimizer_kind(a, on_gpu)
    if kind == "deepspeed":
        return None
    return optimizer(a, params, fused=kind == "torch_fused")


def bf16_enabled(a: TrainArgs, on_gpu: bool = False) -> bool:
    """DeepSpeed's bf16 switch from ``train.autocast``: ``auto`` is bf16 on a GPU and on CPUs with native bf16
    (``harness.device.resolve_dtype``, which answers with a dtype *name*)."""
    if a.autocast == "bfloat16":
        return True
    if a.autocast == "auto":
        return resolve_dtype("auto", accelerator(0) if on_gpu else None) == "bfloat16"
    return False


def ds_config(a: TrainArgs, on_gpu: bool = False) -> dict:
    """The DeepSpeed JSON for this train config (no other source of DeepSpeed settings exists)."""
    acc = a.accumulation()
    zero: dict = {"stage": a.zero_stage, "contiguous_gradients": True, "overlap_comm": bool(on_gpu),
                  "reduce_bucket_size": 5e7, "stage3_gather_16bit_weights_on_model_save": True}
    if a.offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": bool(on_gpu)}
        if a.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": bool(on_gpu)}
    cfg = {
        "train_batch_size": a.global_batch,
        "train_micro_batch_size_per_gpu": a.micro_batch,
        "gradient_accumulation_steps": acc,
        "gradient_clipping": a.grad_clip if a.grad_clip > 0 else 0.0,
        "zero_optimization": zero,
        "bf16": {"enabled": bf16_enabled(a, on_gpu)},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }
    if a.sequence_parallel > 1:
        cfg["sequence_parallel_size"] = a.sequence_parallel  # DeepSpeed's data-parallel size is world / this
        zero["reduce_scatter"] = True  # the gradient average the sequence-parallel loss is scaled for (sequence.py)
    if a.offload and not use_ds_optimizer(a, on_gpu):
        cfg["zero_force_ds_cpu_optimizer"] = False  # train.optimizer=torch with offload: asked for explicitly
    if use_ds_optimizer(a, on_gpu):
        cfg["optimizer"] = {"type": "AdamW", "params": {**adamw_settings(a), "betas": list(a.betas)}}
    return cfg


def torch_extensions_dir() -> str:
    return os.environ.get("TORCH_EXTENSIONS_DIR") or str(ROOT / ".cache" / "torch_extensions")


def prebuild_optimizer_op(a: TrainArgs, on_gpu: bool) -> str | None:
    """Build (or load the cached build of) DeepSpeed's optimizer op in this process, before any rank starts; the
    op's builder name, or None when the ranks need no compiled op."""
    if optimizer_kind(a, on_gpu) != "deepspeed":
        return None
    from deepspeed.accelerator import get_accelerator

    name = "CPUAdamBuilder" if a.offload else "FusedAdamBuilder"
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", torch_extensions_dir())  # where the ranks will look
    builder = get_accelerator().create_op_builder(name)
    if builder is None:
        raise RuntimeError(f"train.optimizer: DeepSpeed has no {name} for this accelerator; use train.optimizer=torch")
    builder.load()
    return name
