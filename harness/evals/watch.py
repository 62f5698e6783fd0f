"""What the model is working on, for messages about it: the input length of the decoder's latest forward (new +
cached tokens), and the one line an out-of-memory error becomes (``harness.pipeline.evaluate`` in one process, the
ranks of ``harness.eval_distributed`` in a data-parallel evaluation)."""
from __future__ import annotations

from harness.config import ConfigError
from harness.models import model_devices


class EvalOutOfMemory(ConfigError):
    """An evaluator ran out of accelerator memory: one line naming the suite entry, the input length and the device
    (a ``ConfigError``: the fix is in the config, shorter lengths or more GPUs; the traceback goes to error.log)."""


def watch_lengths(handle, seen: dict):
    """A forward pre-hook on the model's decoder that keeps, in ``seen``, the tokens of its latest input (new +
    cached) and their device; returns the hook's handle (None for a model without ``get_decoder``)."""
    get = getattr(handle.model, "get_decoder", None)
    decoder = get() if callable(get) else None
    if decoder is None:
        return None

    def pre_hook(module, args, kwargs):
        x = kwargs.get("input_ids")
        if x is None:
            x = args[0] if args else None
        n = int(x.shape[-1]) if x is not None else None
        if n is None and kwargs.get("inputs_embeds") is not None:
            x = kwargs["inputs_embeds"]
            n = int(x.shape[-2])
        cache = kwargs.get("past_key_values")
        cached = int(cache.get_seq_length()) if cache is not None and hasattr(cache, "get_seq_length") else 0
        if n is not None:
            seen.update(tokens=n + cached, new=n, cached=cached, device=str(x.device))

    return decoder.register_forward_pre_hook(pre_hook, with_kwargs=True)


def oom_line(where: str, e: BaseException, seen: dict, handle) -> str:
    device = seen.get("device") or ", ".join(str(d) for d in model_devices(handle.model))
    at = f"at {seen['tokens']} tokens" if "tokens" in seen else "before the model's first forward"
    first = " ".join(str(e).split())
    parts = [p for p in first.split(". ") if p][:3]  # torch's message: what it tried to allocate, what is free
    detail = ". ".join(parts)[:240] or type(e).__name__
    if seen.get("cached"):
        detail += f"; {seen['new']} new + {seen['cached']} cached tokens"
    return f"{where}: out of memory {at} on {device} ({detail}); use shorter eval lengths or spread the model over " \
           f"more GPUs (device_map)"
