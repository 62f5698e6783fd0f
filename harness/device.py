"""Device and compute-dtype helpers shared by loading, evaluation, training and the factor search: which device the
``device`` setting means on this machine (``resolve_device``), which dtype ``auto`` means on this hardware, and the
matching autocast context. Ground floor (imports only torch), so every package may use it."""
from __future__ import annotations

import contextlib
import functools
import os
import re

import torch

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


@functools.cache
def fast_bf16_cpu() -> bool:
    """True when this CPU has native bf16 matmul (AMX or AVX512-BF16). Without it (e.g. AVX2-only EPYC), bf16
    autocast is ~100x slower than fp32 (measured here: 1024^3 matmul 2.8 s in bf16 vs 0.023 s in fp32).
    Cached: the answer cannot change within a process, and every NLL chunk and generation step asks."""
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return False
    return "amx_bf16" in flags or "avx512_bf16" in flags


def resolve_dtype(dtype: str, device: torch.device | None = None) -> str:
    """``auto`` -> bfloat16 on CUDA or on CPUs with native bf16, float32 otherwise."""
    if dtype != "auto":
        return dtype
    if device is not None and is_accelerator(device):
        return "bfloat16"
    return "bfloat16" if fast_bf16_cpu() else "float32"


def autocast(device: torch.device, dtype: str):
    """The autocast context of ``dtype`` (``auto`` resolved) on ``device``; none where torch has no autocast for the
    device's type (the test suite's emulated accelerator, ``tests/virtual_node.py``, computes in float32)."""
    dtype = resolve_dtype(dtype, device)
    if dtype in DTYPES and torch.amp.is_autocast_available(device.type):
        return torch.autocast(device.type, dtype=DTYPES[dtype])
    return contextlib.nullcontext()


def model_device(model) -> torch.device:
    return next(model.parameters()).device


# The device type the harness treats as a GPU: CUDA. The one seam of the test suite's virtual node
# (``tests/virtual_node.py``), whose emulated accelerators are a device type with real CPU data behind it; every
# "is this a GPU" decision and every GPU device the harness makes goes through the two functions below.
ACCELERATOR = "cuda"


def is_accelerator(device) -> bool:
    """Whether ``device`` (a ``torch.device`` or its string) is a GPU."""
    return torch.device(device).type == ACCELERATOR


def accelerator(index: int | None = None) -> torch.device:
    """GPU ``index`` (``cuda:index``; None: the current one)."""
    return torch.device(ACCELERATOR, torch.cuda.current_device() if index is None else int(index))


DEVICES = ("auto", "cpu", "cuda", "cuda:N")  # the valid values of the ``device`` setting


def resolve_device(spec: str = "auto") -> torch.device:
    """The device a run's model lives on: ``auto`` -> ``cuda:$LOCAL_RANK`` when CUDA is available, else the CPU;
    ``cpu``; ``cuda`` (= ``cuda:$LOCAL_RANK``); ``cuda:N``. Raises ``ValueError`` naming ``device`` and the valid
    values for anything else, or for a CUDA device this machine does not have."""
    s = str(spec).strip().lower()
    valid = f"valid: {', '.join(DEVICES)}"
    if s == "auto":
        s = "cuda" if torch.cuda.is_available() else "cpu"
    if s == "cpu":
        return torch.device("cpu")
    m = re.fullmatch(r"cuda(?::(\d+))?", s)
    if not m:
        raise ValueError(f"device: unknown device {spec!r} ({valid})")
    index = int(m.group(1)) if m.group(1) is not None else int(os.environ.get("LOCAL_RANK", "0") or 0)
    n = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if index >= n:
        have = f"{n} CUDA GPU(s) visible" if n else "no CUDA GPU is visible"
        raise ValueError(f"device: {spec!r} asks for cuda:{index} but {have} ({valid})")
    return accelerator(index)
