"""A virtual CUDA node for the test suite: N emulated accelerators with distinct ids and a memory capacity each,
so that the harness's own code resolves ``device: auto``, ``attention.backend: auto``, ``choose_device_map``,
``eval_world_size: auto`` and the training launcher exactly as on a CUDA node, and runs on real values here.

Why not a fake ``cuda`` device. torch's FakeTensorMode on a fake ``cuda`` device cannot run a model on this CPU build
(Python indexing of a CUDA-typed tensor asks for the CUDA device guard: "PyTorch is not linked with support for cuda
devices"), and fake tensors have no values, which the blocked-attention methods, Landmark's insertion and greedy
decoding need (``int(...)``, ``.item()``). So an emulated accelerator is a device of the ``meta`` type (a device whose
guard is a no-op) with an index, ``meta:0`` .. ``meta:N-1``, and ``OnDevice`` is a wrapper tensor that reports one of
them while holding real CPU data. ``Accelerator`` is the dispatch mode that computes every op on that data and
refuses what a real GPU refuses: an op that mixes tensors of two accelerators, or a tensor on an accelerator with a
CPU tensor of one or more dimensions ("Expected all tensors to be on the same device"); CPU scalars, transfers
(``.to``, ``copy_``) and CPU index tensors are allowed, as on CUDA. A factory call with ``device=`` an accelerator
makes a tensor there; one without a device (``torch.arange(n)``) makes a CPU tensor, which is the bug these checks
catch.

``VirtualNode`` (the ``virtual_node`` fixture in ``tests/conftest.py``) is the node: ``torch.cuda``'s queries
(``is_available``, ``device_count``, ``mem_get_info`` = capacity minus the bytes of live tensors on the device,
``memory_allocated``, ``empty_cache``, ``set_device`` / ``current_device``, device names) answer for the emulated
GPUs, and ``harness.device.ACCELERATOR`` -- the device type the harness treats as a GPU, its one seam -- is the
emulated type, so every "is this a GPU" decision of the harness goes the CUDA way. Collectives reach the process group
with the device tensors: ``c10d``'s ops, and DeepSpeed's Ulysses exchange (``EXCHANGES``). What is not emulated: CUDA
kernels (a compiled flex_attention runs with dynamo's own guards and the ``eager`` backend on the CPU data, through
``harness.methods.flex``'s kernel hook), bf16 autocast (torch has none for this device type: float32), streams.
"""
from __future__ import annotations

import contextlib
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode, return_and_correct_aliasing

KIND = "meta"  # the device type of the emulated accelerators
CPU = torch.device("cpu")
STANDIN = torch.device(KIND, 0)
aten = torch.ops.aten
# ops that may take CPU tensors, or tensors of another GPU, beside device ones on a real GPU: transfers, and CPU index
# tensors
MIXED_OK = {aten._to_copy.default, aten.copy_.default, aten.index.Tensor, aten.index_put_.default,
            aten.index_put.default, aten._index_put_impl_.default, aten.lift_fresh.default}
_LIVE: dict[int, weakref.WeakSet] = {}  # emulated GPU index -> its live tensors (memory accounting)


def gpu(i: int) -> torch.device:
    return torch.device(KIND, i)


def _norm(d: torch.device) -> torch.device:
    return torch.device(KIND, 0 if d.index is None else d.index)


class OnDevice(torch.Tensor):
    """Real CPU data (``_data``) on an emulated accelerator (``STANDIN`` = the first)."""

    @staticmethod
    def __new__(cls, data, device: torch.device | None = None, requires_grad: bool | None = None):
        if isinstance(data, OnDevice):  # re-wrapped (accelerate rebuilds a parameter as type(param)(value, ...))
            device = data.device if device is None else device
            data = data._data
        device = _norm(torch.device(STANDIN if device is None else device))
        grad = data.requires_grad if requires_grad is None else requires_grad
        with torch.inference_mode(False):  # never an inference tensor itself (a buffer made under inference mode and
            # used outside it: a view of it would need a version counter); its data may be one
            r = torch.Tensor._make_wrapper_subclass(cls, data.shape, strides=data.stride(),
                                                    storage_offset=data.storage_offset(), dtype=data.dtype,
                                                    device=device, requires_grad=grad)
        r._data = data
        _LIVE.setdefault(device.index, weakref.WeakSet()).add(r)
        return r

    def tolist(self):  # a device-to-host read, as on CUDA
        SYNCS.to_cpu += 1
        return self._data.tolist()

    def __repr__(self):
        return f"OnDevice({self._data!r}, {self.device})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


def allocated(index: int) -> int:
    """Bytes of the live tensors on emulated GPU ``index`` (each storage once)."""
    seen: dict = {}
    for t in list(_LIVE.get(index, ())):
        s = t._data.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def _on(t) -> bool:
    return isinstance(t, OnDevice) or (isinstance(t, torch.Tensor) and t.device.type == KIND)


def _real_meta(tensors: list, devices: list) -> bool:
    """An op of the real ``meta`` device: ``device="meta"`` without an index (the emulated GPUs always have one) or a
    plain meta tensor, and no tensor on an emulated GPU. transformers builds a model there before loading its weights
    (and then materialises the non-persistent buffers on the CPU): taken for an emulated GPU, the rotary ``inv_freq``
    was computed there and the CPU copy transformers made of it was left uninitialised (NaN losses, by the order the
    tests ran in)."""
    if any(isinstance(t, OnDevice) for t in tensors) or any(d.type == KIND and d.index is not None for d in devices):
        return False
    return any(d.type == KIND for d in devices) or any(t.device.type == KIND for t in tensors)


def _exchange(args):
    """``deepspeed::dim_zero_all_to_all`` (Ulysses's exchange, a custom op rather than a ``c10d`` one) as its own body
    runs it on a GPU: the output made on the input's device, then ``all_to_all_single`` on the device tensors, so the
    process group sees them (run on the CPU data, the group would get CPU tensors an NCCL-like group refuses)."""
    from deepspeed.sequence.layer import _all_to_all_groups

    inp, group_name = args[0], args[1]
    out = torch.empty_like(inp)
    torch.distributed.all_to_all_single(out, inp, group=_all_to_all_groups[group_name])
    return out


EXCHANGES = {"deepspeed::dim_zero_all_to_all"}  # collectives outside c10d: routed as c10d's are


def _dispatch(func, args, kwargs):
    if func.namespace == "deepspeed" and func.name().split(".")[0] in EXCHANGES:
        return _exchange(args)
    if func.namespace == "c10d":  # a collective: the process group decides (an NCCL-like one refuses CPU tensors)
        if func is torch.ops.c10d.barrier.default:  # no data: torch makes its own tensor, on the current GPU on CUDA
            args = (OnDevice(args[0], gpu(torch.cuda.current_device())), *args[1:])
        with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(torch._C.DispatchKey.Python)):
            return func(*args, **kwargs)
    tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    devices = [d for d in pytree.tree_leaves((args, kwargs)) if isinstance(d, torch.device)]
    if _real_meta(tensors, devices):  # transformers' empty-weights init: the real meta device, as on a GPU node
        return func(*args, **kwargs)
    on = [t for t in tensors if _on(t)]
    off = [t for t in tensors if not _on(t) and t.dim() > 0]
    devs = list(dict.fromkeys(_norm(t.device) for t in on))
    if func not in MIXED_OK and (len(devs) > 1 or (on and off)):
        other = devs[1] if len(devs) > 1 else CPU
        raise RuntimeError(f"Expected all tensors to be on the same device, but found at least two devices, "
                           f"{devs[0]} (an emulated accelerator) and {other}! ({func})")
    to_dev = [_norm(d) for d in devices if d.type == KIND]
    to_cpu = any(d.type == "cpu" for d in devices)

    def unwrap(x):
        if isinstance(x, torch.device) and x.type == KIND:
            return CPU
        if isinstance(x, OnDevice):
            return x._data
        if isinstance(x, torch.Tensor) and x.device.type == KIND:
            raise RuntimeError(f"a tensor with no data on an emulated accelerator reached {func}")
        return x

    if on:
        SYNCS.saw(func, args, to_cpu)
    a, k = pytree.tree_map(unwrap, (args, kwargs))
    out = func(*a, **k)
    target = to_dev[0] if to_dev else (None if to_cpu or not on else devs[0])
    out = pytree.tree_map(lambda t: OnDevice(t, target) if target is not None and isinstance(t, torch.Tensor)
                          else t, out)
    # in-place ops return their (wrapped) argument, and in-place view ops (squeeze_, inside matmul) update its shape;
    if on and target is not None and target == devs[0]:  # a transfer to another GPU aliases nothing
        return return_and_correct_aliasing(func, args, kwargs, out)
    return out


class HostSyncs:
    """What the node's device tensors made the host wait for, and how many device ops ran (each at least one kernel
    launch on a GPU): ``item`` (``.item()``, ``int()``, ``bool()``, a Python-side length check on a device value:
    ``aten._local_scalar_dense``), ``to_cpu`` (``.cpu()``, ``.tolist()``, ``.numpy()``: a device-to-host copy) and
    ``shape`` (an op whose output size depends on the values, ``nonzero`` and kin: the host waits to allocate it).
    ``reset()`` between measurements; ``syncs`` is their sum."""

    # a device value read as a Python number or bool (inference mode dispatches ``item`` and ``is_nonzero`` whole)
    TO_PYTHON = {aten._local_scalar_dense.default, aten.item.default, aten.is_nonzero.default, aten.equal.default,
                 aten.allclose.default}
    DATA_DEPENDENT = {aten.nonzero.default, aten.masked_select.default, aten._unique2.default,
                      aten.unique_consecutive.default, aten.unique_dim.default, aten.repeat_interleave.Tensor}

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.item = self.to_cpu = self.shape = self.launches = 0

    @property
    def syncs(self) -> int:
        return self.item + self.to_cpu + self.shape

    def saw(self, func, args, to_cpu: bool) -> None:
        self.launches += 1
        if func in self.TO_PYTHON:
            self.item += 1
        elif (func is aten._to_copy.default and to_cpu) or (func is aten.copy_.default and not _on(args[0])):
            self.to_cpu += 1
        elif func in self.DATA_DEPENDENT:
            self.shape += 1

    def snapshot(self) -> dict:
        return {"item": self.item, "to_cpu": self.to_cpu, "shape": self.shape, "syncs": self.syncs,
                "launches": self.launches}


SYNCS = HostSyncs()  # the session's counter: tests reset it around what they measure


class _Dispatch(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return _dispatch(func, args, kwargs or {})


class _Constructors(TorchFunctionMode):
    """``torch.tensor`` / ``as_tensor`` with a device build their data below the dispatcher: build on the CPU and
    wrap, so ``torch.tensor(x, device=dev)`` is on the device and ``torch.tensor(x)`` is not."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        want = kwargs.get("device")
        if func in (torch.tensor, torch.as_tensor, torch.asarray) and want is not None \
                and torch.device(want).type == KIND and torch.device(want).index is not None:
            return OnDevice(func(*args, **{**kwargs, "device": CPU}), torch.device(want))
        return func(*args, **kwargs)


class Accelerator:
    """Inside: tensors made on an emulated accelerator are there (real values, checked placement)."""

    def __enter__(self):
        self._modes = [_Constructors(), _Dispatch()]
        for m in self._modes:
            m.__enter__()
        return self

    def __exit__(self, *exc):
        for m in reversed(self._modes):
            m.__exit__(*exc)


def to_accelerator(model, device: torch.device = STANDIN):
    """Move every parameter and buffer of ``model`` to an emulated accelerator (values kept)."""
    for mod in model.modules():
        for n, p in list(mod._parameters.items()):
            if p is not None and not isinstance(p, OnDevice):
                mod._parameters[n] = torch.nn.Parameter(OnDevice(p.detach(), device), requires_grad=p.requires_grad)
        for n, b in list(mod._buffers.items()):
            if b is not None and not isinstance(b, OnDevice):
                mod._buffers[n] = OnDevice(b, device)
    return model


def on_gpus(model) -> set:
    """The emulated GPUs that hold a parameter or buffer of ``model``."""
    return {_norm(t.device).index for t in list(model.parameters()) + list(model.buffers()) if _on(t)}


def unwrap(t):
    """The CPU data of an emulated tensor (anything else as it is)."""
    return t._data if isinstance(t, OnDevice) else t


class KernelStats:
    """What the node's compiled flex kernels did: graphs compiled (dynamo's real guards decide), calls that ran a
    compiled graph, and kernel calls; ``kernel_calls - graph_calls`` ran outside a compiled graph (dynamo gave up:
    the unfused, materialising flex_attention on a GPU)."""

    def __init__(self):
        self.compiles = self.graph_calls = self.kernel_calls = 0

    def backend(self, gm, example_inputs):
        """A ``torch.compile`` backend: the traced graph run as it is (``eager``), counted."""
        self.compiles += 1

        def run(*args):
            self.graph_calls += 1
            return gm.forward(*args)

        return run

    @property
    def eager_calls(self) -> int:
        return self.kernel_calls - self.graph_calls


KERNELS = KernelStats()  # one backend for every node of the session: dynamo's cache entries are per code object and
# backend, so the compiled kernels are shared by every test (as by every method of one process on a GPU)


def _cpu_function(f, where: list):
    """``f`` (a mask function) with its captured tensors replaced by their CPU data (their devices added to
    ``where``)."""
    import types

    if not isinstance(f, types.FunctionType) or not f.__closure__:
        return f
    cells = []
    for c in f.__closure__:
        v = c.cell_contents
        if isinstance(v, torch.Tensor):
            where.append(_norm(v.device) if _on(v) else (CPU if v.dim() > 0 else None))
            v = unwrap(v)
        cells.append(types.CellType(v))
    return types.FunctionType(f.__code__, f.__globals__, f.__name__, f.__defaults__, tuple(cells))


class VirtualNode:
    """``gpus`` emulated accelerators of ``capacity`` bytes each, seen through ``torch.cuda`` and
    ``harness.device``. ``install(monkeypatch)`` patches the queries; ``with node:`` enters the dispatch mode."""

    def __init__(self, gpus: int = 2, capacity: int = 80 * 2**30, name: str = "Virtual A100-80GB"):
        self.gpus, self.capacity, self.name = gpus, capacity, name
        self.current = 0
        self.empty_cache_calls = 0
        self._accel = None
        self.kernels = KERNELS

    @property
    def devices(self) -> list[torch.device]:
        return [gpu(i) for i in range(self.gpus)]

    def _index(self, device=None) -> int:
        if device is None:
            return self.current
        if isinstance(device, int):
            return device
        d = torch.device(device)
        return self.current if d.index is None else d.index

    def free(self, device=None) -> int:
        return max(0, self.capacity - allocated(self._index(device)))

    def install(self, monkeypatch) -> VirtualNode:
        import harness.device

        node = self

        def set_device(d):
            node.current = node._index(d)

        def empty_cache():
            node.empty_cache_calls += 1

        props = type("Props", (), {"name": self.name, "total_memory": self.capacity})
        patches = {"is_available": lambda: True, "device_count": lambda: node.gpus,
                   "mem_get_info": lambda device=None: (node.free(device), node.capacity),
                   "memory_allocated": lambda device=None: allocated(node._index(device)),
                   "max_memory_allocated": lambda device=None: allocated(node._index(device)),
                   "reset_peak_memory_stats": lambda device=None: None, "synchronize": lambda device=None: None,
                   "empty_cache": empty_cache, "set_device": set_device, "current_device": lambda: node.current,
                   "get_device_name": lambda device=None: node.name,
                   "get_device_properties": lambda device=None: props()}
        self._real = {k: getattr(torch.cuda, k) for k in patches}
        for k, v in patches.items():
            monkeypatch.setattr(torch.cuda, k, v)
        monkeypatch.setattr(harness.device, "ACCELERATOR", KIND)
        import accelerate.big_modeling

        # accelerate asks nvidia-smi whether the GPUs talk peer to peer: the node's answer, not a process
        monkeypatch.setattr(accelerate.big_modeling, "check_cuda_p2p_ib_support", lambda: True)
        from harness.methods import flex

        monkeypatch.setattr(flex, "KERNEL_BACKEND", self.kernels.backend)
        monkeypatch.setattr(flex, "run_kernel", self.run_kernel)
        return self

    def run_kernel(self, fn, *args, **kwargs):
        """``harness.methods.flex.run_kernel`` on this node: the kernel (the compiled flex_attention or
        create_block_mask the harness chose for a GPU, with this node's counting ``eager`` backend) runs on the CPU
        data behind the emulated GPU, after checking that every tensor it reads -- the mask function's captured
        tensors too -- is on that one GPU (a CPU tensor captured in a mask fails on CUDA as well). A block mask made
        here stays on the CPU, marked with its GPU. With gradients (training: torch has no CPU flex backward) the
        same mask is evaluated densely on the device, ``flex.dense_attention``, as the CPU path does."""
        from torch.nn.attention.flex_attention import AuxOutput, BlockMask

        from harness.methods import flex

        self.kernels.kernel_calls += 1
        SYNCS.launches += 1  # one fused kernel
        where: list = []
        bm = kwargs.get("block_mask")
        if isinstance(bm, BlockMask):
            where.append(getattr(bm, "virtual_device", CPU))
        for t in pytree.tree_leaves((args, {k: v for k, v in kwargs.items() if k != "block_mask"})):
            if isinstance(t, torch.Tensor):
                where.append(_norm(t.device) if _on(t) else (CPU if t.dim() > 0 else None))
            elif isinstance(t, torch.device):
                where.append(_norm(t) if t.type == KIND else t)
        cpu_args = [_cpu_function(a, where) if callable(a) else a for a in args]
        devs = list(dict.fromkeys(d for d in where if d is not None))
        if len(devs) != 1 or devs[0].type != KIND:
            raise RuntimeError(f"Expected all tensors to be on the same device, but a flex kernel got {devs}")
        dev = devs[0]
        if isinstance(bm, BlockMask):  # flex_attention(q, k, v, block_mask=...)
            q, k, v = args[:3]
            if any(t.requires_grad for t in (q, k, v)) and torch.is_grad_enabled():
                self.kernels.kernel_calls -= 1  # not a kernel call: the dense evaluation, on the device
                out, lse = flex.dense_attention(q, k, v, bm.virtual_mask, kwargs.get("scale"))
                return (out.to(q.dtype), AuxOutput(lse=lse)) if kwargs.get("return_aux") is not None \
                    else out.to(q.dtype)
        cpu_kwargs = {k: (CPU if isinstance(v, torch.device) else v) for k, v in kwargs.items()}
        with self.off(), self.real_cuda():  # the kernel runs on the CPU (dynamo asks torch.cuda what exists)
            a, kw = pytree.tree_map(unwrap, (cpu_args, cpu_kwargs))
            out = fn(*a, **kw)
        if isinstance(out, BlockMask):
            out.virtual_device, out.virtual_mask = dev, args[0]
            return out
        if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], AuxOutput):
            return OnDevice(out[0], dev), AuxOutput(*[None if x is None else OnDevice(x, dev) for x in out[1]])
        return OnDevice(out, dev)

    def __enter__(self):
        self._accel = Accelerator().__enter__()
        return self

    def __exit__(self, *exc):
        self._accel.__exit__(*exc)

    @contextlib.contextmanager
    def real_cuda(self):
        """``torch.cuda`` as it really is, for a while."""
        patched = {k: getattr(torch.cuda, k) for k in self._real}
        for k, v in self._real.items():
            setattr(torch.cuda, k, v)
        try:
            yield
        finally:
            for k, v in patched.items():
                setattr(torch.cuda, k, v)

    @contextlib.contextmanager
    def off(self):
        """Leave the dispatch mode for a while (code that must see plain CPU tensors)."""
        self._accel.__exit__(None, None, None)
        try:
            yield
        finally:
            self._accel.__enter__()
