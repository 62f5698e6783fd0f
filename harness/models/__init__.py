"""Models: one file + one YAML each, registered by short name (``model=tiny_llama``); a model that is only data (a
hub checkpoint: LLaMA2-7B, Phi-2) is one YAML naming the generic builder (``builder: hub``, ``harness/models/hub.py``).

A model builder returns a ``ModelHandle``: the transformers model, its tokenizer and the facts the methods and
evaluators need (native context window, rotary dimension). Loading is offline by construction: local directories,
files shipped inside installed packages, or a hub id that must already be in the local cache on a cluster.
"""
from __future__ import annotations

import importlib.util
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from harness.conf_utils import group_defaults
from harness.config import ConfigError
from harness.device import accelerator, is_accelerator, resolve_device
from harness.memory import eval_memory, replica_gpus, shape_of
from harness.registry import Registry

MODELS: Registry = Registry("model", "harness.models")

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class ModelArgs:
    """Fields shared by every model YAML."""

    name: str = ""
    path: str = ""  # local dir or hub id (hub ids only resolve from the local cache: no downloads at run time)
    native_ctx: int = 0  # pretrained context window C
    dtype: str = "float32"  # weights dtype; compute uses autocast from the train/eval configs
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2 (GPU only; falls back to sdpa)
    gguf_file: str = ""
    builder: str = ""  # the registered builder when it is not ``name`` (``hub``: a model that is only data)
    # the checkpoint's layer shapes (layers, hidden, mlp, heads, kv_heads, head_dim, vocab, mlp_mats, tied: its
    # config.json's), for a plan made where the weights are not (harness.plan); empty: read from the checkpoint
    shape: dict = field(default_factory=dict)


@dataclass
class ModelHandle:
    model: Any
    tokenizer: Any
    name: str
    native_ctx: int
    info: dict = field(default_factory=dict)

    @property
    def config(self):
        return self.model.config

    def facts(self) -> dict:
        """What was loaded and how it runs, for the row (``model_info``): path, window, device (and the GPUs a split
        model spans), weight dtype, and the attention implementation in use (after any fallback, and after a method
        registered its own)."""
        p = next(self.model.parameters())
        dm = self.info.get("device_map") or None
        return {"path": self.info.get("path"), "native_ctx": self.native_ctx,
                "device": self.info.get("device") or str(p.device),
                "gpus": sorted({d for d in dm.values() if d not in ("cpu", "disk")}) if dm else None,
                "dtype": str(p.dtype).removeprefix("torch."),
                "attn_implementation": getattr(self.model.config, "_attn_implementation", None),
                "parameters": sum(q.numel() for q in self.model.parameters())}


@runtime_checkable
class ModelBuilder(Protocol):
    """The contract of a registered model: an ``Args`` dataclass (``ModelArgs`` or a subclass, validated against the
    YAML) and a static ``build(args, device=None, device_map=None) -> ModelHandle`` that loads onto ``device`` (or
    spreads the model by ``device_map``, ``place``); optionally ``source(args) -> (path, gguf_file)``."""

    Args: ClassVar[type]

    @staticmethod
    def build(a: Any, device=None, device_map=None) -> ModelHandle: ...


def resolve_attn_implementation(requested: str) -> str:
    if requested == "flash_attention_2":
        has_fa = importlib.util.find_spec("flash_attn") is not None
        if not (has_fa and torch.cuda.is_available()):
            warnings.warn("flash_attention_2 needs the flash-attn package and a CUDA GPU; falling back to sdpa",
                          stacklevel=2)
            return "sdpa"
    return requested


def load_pretrained(path: str, dtype: str, attn_implementation: str, gguf_file: str = "", device=None,
                    device_map=None):
    """Load a causal LM and its tokenizer from a local directory, a cached hub id, or a GGUF file, and put it on
    ``device`` (a ``torch.device``; None = where transformers loads it, the CPU) or spread it by ``device_map``
    (``place``)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    kw: dict = {"gguf_file": gguf_file} if gguf_file else {}
    is_local = os.path.isdir(path)
    if not is_local and not gguf_file:
        kw["local_files_only"] = os.environ.get("HF_HUB_OFFLINE", "1") == "1"
    if is_local and not gguf_file:
        check_weight_files(path)
    try:
        tok = AutoTokenizer.from_pretrained(path, **kw)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=DTYPES[dtype], attn_implementation=resolve_attn_implementation(attn_implementation), **kw
        )
    except (OSError, ValueError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        if gguf_file:  # the file, and what a reshape or mmap failure of one means
            raise ConfigError(f"cannot load model from {os.path.join(path, gguf_file)!r}: {first} (a truncated or "
                              f"damaged GGUF file?)") from None
        raise ConfigError(f"cannot load model from {path!r}: {first}") from None
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model.eval()
    if device is not None or device_map is not None:
        model = place(model, device, device_map)
    return model, tok


def check_weight_files(folder: str) -> None:
    """Before transformers reads a local folder's weights: each ``*.safetensors`` file has a readable header (a
    truncated or empty download is one line naming the file, not safetensors' "incomplete metadata"), and every
    tensor it holds has the shape ``config.json`` implies (built on the meta device, no weights allocated): a
    vocabulary or size mismatch is one line naming the file, the tensor and both shapes, not transformers' report."""
    from safetensors import safe_open

    files = sorted(Path(folder).glob("*.safetensors"))
    shapes: dict = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as h:
                for k in h.keys():
                    shapes[k] = (tuple(h.get_slice(k).get_shape()), f.name)
        except Exception as e:  # noqa: BLE001 - safetensors' own error type: one line naming the file
            first = (str(e).strip().splitlines() or [type(e).__name__])[0]
            raise ConfigError(f"model.path: {f} is not a readable safetensors file ({first}; a truncated or empty "
                              f"download?)") from None
    if not shapes:
        return
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        with torch.device("meta"):
            want = {k: tuple(v.shape) for k, v in AutoModelForCausalLM.from_config(
                AutoConfig.from_pretrained(folder)).state_dict().items()}
    except Exception:  # noqa: BLE001 - a config transformers cannot build: its own load says why
        return
    for k, (shape, fname) in shapes.items():
        if k in want and want[k] != shape:
            raise ConfigError(f"model.path: {Path(folder) / fname}: {k} is {list(shape)} but config.json implies "
                              f"{list(want[k])} (a vocabulary or size mismatch between the weights and the config)")


def place(model, device, device_map=None):
    """Put ``model`` where it runs: on ``device``; or, with ``device_map`` an integer g (GPUs per model replica,
    :func:`choose_device_map`) or ``"auto"`` (every visible GPU from ``device`` on), its layers split evenly over the
    g GPUs ``device.index .. device.index + g - 1`` by accelerate: an even split (``get_balanced_memory``), because
    each layer's KV cache lives with the layer, so the cache is split as the weights are (a first-fit map would put
    every layer, and so the whole cache, on the first GPU). An accelerate map (dict) is used as it is. Returns the
    model."""
    if device_map is None:
        return model.to(device)
    from accelerate import dispatch_model

    if not isinstance(device_map, dict):
        first = torch.device(device).index or 0
        g = torch.cuda.device_count() - first if device_map == "auto" else int(device_map)
        device_map = split_map(model, {i: int(0.9 * torch.cuda.mem_get_info(i)[0]) for i in range(first, first + g)})
    # accelerate's integers are GPU indices: handed over as the GPU devices they mean; the model keeps the map
    model = dispatch_model(model, device_map={k: accelerator(v) if isinstance(v, int) else v
                                              for k, v in device_map.items()})
    model.hf_device_map = dict(device_map)
    return model


def split_map(model, max_memory: dict) -> dict:
    """The accelerate device map that splits ``model``'s layers evenly over the GPUs of ``max_memory`` ({GPU index:
    usable bytes}); never splits a decoder layer (``_no_split_modules``)."""
    from accelerate import infer_auto_device_map
    from accelerate.utils import get_balanced_memory

    no_split = getattr(model, "_no_split_modules", None) or []
    balanced = get_balanced_memory(model, max_memory=dict(max_memory), no_split_module_classes=no_split)
    return infer_auto_device_map(model, max_memory=balanced, no_split_module_classes=no_split)


def unplace(model):
    """Take a model spread by accelerate off its GPUs' hooks (its map dropped); the model, still where it was."""
    if getattr(model, "hf_device_map", None):
        from accelerate.hooks import remove_hook_from_module

        remove_hook_from_module(model, recurse=True)
        del model.hf_device_map
    return model


def release(handle) -> dict | None:
    """Move ``handle.model`` off the GPUs (accelerate's hooks off, weights to the host, the CUDA cache emptied), for
    processes that need the GPUs' memory (training ranks, evaluation ranks); returns where it was (for
    :func:`restore`), or None when it was not on a GPU."""
    try:
        p = next(handle.model.parameters())
    except (StopIteration, AttributeError):
        return None
    if not (is_accelerator(p.device) or handle.info.get("device_map")):
        return None
    where = {"device": p.device, "gpus": gpus_of(handle)}
    handle.model = unplace(handle.model).to("cpu")
    torch.cuda.empty_cache()
    return where


def restore(handle, where: dict | None) -> None:
    """Put ``handle.model`` back where :func:`release` took it from."""
    if where is not None:
        reposition(handle, where["device"], where["gpus"])


def reposition(handle, device, gpus: int) -> None:
    """Place ``handle.model`` over ``gpus`` GPUs from ``device`` on (1: on ``device``) unless it is already so placed:
    the placement of one evaluator and length (``harness.pipeline.placement``). ``handle.info`` follows."""
    gpus = max(1, int(gpus))
    split = bool(getattr(handle.model, "hf_device_map", None))
    here = next(handle.model.parameters()).device
    if (split and gpus_of(handle) == gpus) or (not split and gpus == 1 and here == torch.device(device)):
        return
    handle.model = place(unplace(handle.model), device, gpus if gpus > 1 else None)
    dm = getattr(handle.model, "hf_device_map", None)
    handle.info["device"] = str(device if dm is None else next(handle.model.parameters()).device)
    handle.info["device_map"] = {str(k): str(v) for k, v in dm.items()} if dm else None


def gpus_of(handle) -> int:
    """How many GPUs one replica of the loaded model spans (1 on one device)."""
    dm = handle.info.get("device_map") or {}
    return max(1, len({d for d in dm.values() if d not in ("cpu", "disk")}))


def check_device(spec, key: str = "device") -> torch.device:
    """The ``device`` setting resolved (``harness.device.resolve_device``), a bad value as one ConfigError line."""
    try:
        return resolve_device(str(spec))
    except ValueError as e:
        raise ConfigError(str(e).replace("device:", f"{key}:", 1)) from None


def checkpoint_shape(cfg_model) -> tuple[dict, int]:
    """The shape (``harness.memory.shape_of``) of the checkpoint a ``model`` config names, read from its config
    alone (nothing loaded), and its weights' bytes per value."""
    from transformers import AutoConfig

    name = cfg_model.get("name")
    cls, args = MODELS.args(cfg_model, f"model={name}", name=cfg_model.get("builder") or name)
    path, gguf = cls.source(args) if hasattr(cls, "source") else (args.path, args.gguf_file)
    kw = {"gguf_file": gguf} if gguf else {"local_files_only": os.environ.get("HF_HUB_OFFLINE", "1") == "1"}
    return shape_of(AutoConfig.from_pretrained(path, **kw)), DTYPES[args.dtype].itemsize


def visible_gpus(device: torch.device) -> int:
    """The GPUs a replica whose first GPU is ``device`` may span (``device`` and the ones after it); 0 off a GPU."""
    if not is_accelerator(device):
        return 0
    return max(0, torch.cuda.device_count() - (device.index or 0))


def choose_device_map(cfg_model, device: torch.device, length: int, generates: bool):
    """How many GPUs one replica of the model needs (an integer g > 1, for :func:`place`) for one evaluation input of
    ``length`` tokens when ``device`` is a GPU and more than one is visible from it: ``harness.memory.replica_gpus``
    of the checkpoint's shape with ``device``'s free memory (the rule the plan uses, per evaluator and length:
    ``harness.evals.replica_gpus``), capped at the GPUs visible from ``device`` on (``check_fits`` then refuses what
    still cannot fit); else None (one device)."""
    visible = visible_gpus(device)
    if visible < 2:
        return None
    free = available_memory(device)
    if free is None:
        return None
    shape, itemsize = checkpoint_shape(cfg_model)
    g = replica_gpus(shape, int(length), itemsize, generates, free)
    g = visible if g is None else min(g, visible)
    return g if g > 1 else None


def rotary_dim(config) -> int:
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    rp = getattr(config, "rope_parameters", None) or {}
    prf = rp.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0)) or 1.0
    return int(head_dim * prf)


def hf_config(cfg_model):
    """The transformers config of the checkpoint a run of ``cfg_model`` will load, read without its weights
    (``config.json`` of a folder or of a hub id in the local cache), or None when it cannot be read here (the load
    then says why) or is a GGUF file (transformers parses the whole file for its config: 9 s for SmolLM2-135M): what
    ``Method.check_model`` checks before anything loads."""
    from transformers import AutoConfig

    try:
        name = cfg_model.get("name")
        cls, args = MODELS.args(cfg_model, f"model={name}", name=cfg_model.get("builder") or name)
        path, gguf = cls.source(args) if hasattr(cls, "source") else (args.path, args.gguf_file)
        if gguf:
            return None
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return AutoConfig.from_pretrained(path, local_files_only=True)
    except Exception:  # noqa: BLE001 - not readable here (a cluster path, a hub id not cached): the load reports it
        return None


def available_memory(device: torch.device) -> int | None:
    """Free bytes where the model's tensors live: the GPU's free memory, or the host's MemAvailable (None if
    unknown)."""
    if is_accelerator(device):
        return int(torch.cuda.mem_get_info(device.index or 0)[0])
    try:
        for line in open("/proc/meminfo"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def min_bytes(config, length: int, itemsize: int, generates: bool) -> int:
    """The memory one input of ``length`` tokens needs beyond the weights (``harness.memory.eval_memory``: the KV
    cache of every layer when the evaluator decodes, ``generates``, plus the prefill's transient activations)."""
    m = eval_memory(shape_of(config), int(length), itemsize=itemsize, generates=generates)
    return m["kv_cache"] + m["prefill"]


def model_devices(model) -> list[torch.device]:
    """The devices the model's weights are on: every device of ``model.hf_device_map`` (a model spread by
    ``device_map``; integers are CUDA indices), else the device of its first parameter."""
    dm = getattr(model, "hf_device_map", None) or {}
    out: list[torch.device] = []
    for d in dm.values():
        if d == "disk":
            continue
        dev = accelerator(d) if isinstance(d, int) else torch.device(d)
        if is_accelerator(dev) and dev.index is None:
            dev = accelerator(0)
        if dev not in out:
            out.append(dev)
    return out or [next(model.parameters()).device]


def check_fits(handle: ModelHandle, length: int, generates: bool, key: str) -> None:
    """Refuse, before fine-tuning or evaluating, an evaluation input that cannot fit in the free memory of the
    devices the model is on. The weights are already there, so what is compared with the free memory (summed over
    every device of ``hf_device_map``) is the rest of ``harness.memory.eval_memory``: the KV cache (when the
    evaluator decodes) plus the prefill's transient activations, which must also fit on one device (the layer
    computing holds them). An estimate (its assumptions: ``harness/memory.py``), not a bound."""
    if length <= 0:
        return

    p = next(handle.model.parameters())
    m = eval_memory(shape_of(handle.model.config), int(length), itemsize=p.element_size(), generates=generates)
    devices = model_devices(handle.model)
    frees = [available_memory(d) for d in devices]
    if any(f is None for f in frees):
        return
    free, need = sum(frees), m["kv_cache"] + m["prefill"]
    if need > free or m["prefill"] > max(frees):
        where = ", ".join(str(d) for d in devices)
        parts = (f"KV cache {_size(m['kv_cache'])} + " if generates else "") + f"prefill activations " \
                f"{_size(m['prefill'])}; weights {_size(m['weights'])} already loaded"
        raise ConfigError(f"{key}: an input of {length} tokens needs about {_size(need)} beyond the weights ({parts}, "
                          f"{handle.name} in {p.dtype}) but {_size(free)} is free on {where}; use shorter eval "
                          f"lengths or spread the model over more GPUs (device_map)")


def _size(n: int) -> str:
    return f"{n / 2**30:.1f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def build_model(cfg, device=None, device_map=None) -> ModelHandle:
    """The one builder: validate the ``model`` config group and load it onto ``device`` (a ``torch.device`` or a
    ``device`` setting such as ``auto``; None = the CPU, where transformers loads) or spread by ``device_map``.
    ``handle.info`` records ``device`` and ``device_map``."""
    name = (cfg or {}).get("name") if not hasattr(cfg, "name") else cfg.name
    if not name:
        raise ConfigError("model config has no name")
    builder = (cfg or {}).get("builder") if not hasattr(cfg, "builder") else cfg.builder
    cls, args = MODELS.args(cfg, f"model={name}", name=builder or name)
    args.name = name
    if device is not None and not isinstance(device, torch.device):
        device = check_device(device)
    handle = cls.build(args, device=device, device_map=device_map)
    dm = getattr(handle.model, "hf_device_map", None) if device_map is not None else None
    handle.info["device"] = str(device if device is not None and dm is None else
                                next(handle.model.parameters()).device)
    handle.info["device_map"] = {str(k): str(v) for k, v in dm.items()} if dm else None
    return handle


def plain_weights(model) -> None:
    """A model loaded from a GGUF file holds dequantised ``nn.Linear`` weights but keeps transformers' GGUF quantizer
    marker, which refuses ``save_pretrained``; drop the marker (after checking that no packed GGUF layer is left), so
    the folder is an ordinary float checkpoint."""
    packed = sorted({type(m).__name__ for m in model.modules() if type(m).__name__.lower().startswith("gguf")})
    if packed:
        raise ValueError(f"the model still has packed GGUF layers {packed}; cannot write a plain checkpoint")
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    for cfg in (model.config, getattr(model.config, "text_config", None)):
        if cfg is not None and hasattr(cfg, "quantization_config"):
            del cfg.quantization_config


def gguf_to_folder(source: str, out: str, dtype: str = "float32", log=print) -> dict:
    """Write a Hugging Face folder (config, safetensors weights, tokenizer) from a GGUF file, dequantised to
    ``dtype``: ``source`` is a ``.gguf`` file or a registered model that ships one (``smollm2_135m``). Refuses an
    output folder that exists and is not empty. Returns what was written (folder, window C, parameters, dtype)."""
    from pathlib import Path

    if dtype not in DTYPES:
        raise ConfigError(f"dtype: {dtype!r} is not a weights dtype (valid: {', '.join(DTYPES)})")
    dest = Path(out)
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ConfigError(f"{out}: exists and is not an empty folder (valid: a new or empty folder)")
    if str(source).endswith(".gguf"):
        f = Path(source)
        if not f.is_file():
            raise ConfigError(f"{source}: no such GGUF file")
        directory, name = str(f.resolve().parent), f.name
    else:
        cls, args = MODELS.args({"name": source}, f"model={source}")
        if not hasattr(cls, "source"):
            raise ConfigError(f"{source!r}: neither a .gguf file nor a registered model that ships one")
        directory, name = cls.source(args)
        if not name:
            raise ConfigError(f"model {source!r} does not load from a GGUF file (valid: a .gguf path, or "
                              f"smollm2_135m)")
    log(f"gguf: loading {directory}/{name} (dequantised to {dtype}; ~15 s for SmolLM2-135M)")
    model, tok = load_pretrained(directory, dtype, "sdpa", gguf_file=name)
    plain_weights(model)
    log(f"gguf: writing {dest}")
    model.save_pretrained(dest)
    tok.save_pretrained(dest)
    return {"folder": str(dest), "source": f"{directory}/{name}",
            "native_ctx": int(getattr(model.config, "max_position_embeddings", 0) or 0),
            "parameters": sum(p.numel() for p in model.parameters()), "dtype": dtype}


def load_model(name: str, **overrides) -> ModelHandle:
    """Convenience for scripts and tests: load a registered model with its YAML defaults plus overrides."""
    node = group_defaults("model", name)
    node.update(overrides)
    return build_model(node)
